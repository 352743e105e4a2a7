// lamp::data::write_token_files(): token files whose ids are the
// tokenizer's for the whole text, however it is cut for the threads (every
// split lamp has, and SentencePiece's), each document ended as asked, JSON
// Lines read by field, uint32 ids for a vocabulary above 65,536, and bad
// input refused with nothing written and nothing overwritten.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "compress_util.h"
#include "test_util.h"

namespace {

using lamp::data::BytePairEncoding;
using lamp::data::BytePairSplit;
using lamp::data::TextDocuments;
using lamp::data::TokenFileOptions;
using lamp::data::Tokenizer;
using lamp::data::write_token_files;
using lamp_test::error_of;

const std::string kFiles = LAMP_SOURCE_DIR "/tests/python/byte_pair";

// A scratch folder of the running test.
class Scratch : public lamp_test::ScratchFolder {
 public:
  explicit Scratch(const std::string& name) : ScratchFolder("lamp_tw", name) {}
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

// The little-endian ids of a token file of `width`-byte ids.
std::vector<int64_t> ids_in(const std::string& path, int width) {
  const auto bytes = read(path);
  EXPECT_EQ(bytes.size() % static_cast<size_t>(width), 0u) << path;
  std::vector<int64_t> ids;
  for (size_t i = 0; i + static_cast<size_t>(width) <= bytes.size();
       i += static_cast<size_t>(width)) {
    uint64_t id = 0;
    for (int b = 0; b < width; ++b) {
      id |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i + b]))
            << (8 * b);
    }
    ids.push_back(static_cast<int64_t>(id));
  }
  return ids;
}

std::vector<int64_t> encoded(const Tokenizer& tokenizer,
                             const std::string& text) {
  const auto ids = tokenizer.encode(text);
  return std::vector<int64_t>(ids.data_ptr<int64_t>(),
                              ids.data_ptr<int64_t>() + ids.numel());
}

// Lines of what the splits treat apart: runs of spaces before and after
// line breaks, blank lines, CRLF, punctuation at a line's end, digits,
// contractions in both cases, CamelCase, accented, CJK and emoji text,
// tabs, slashes after breaks. Many lines start with a letter after a
// visible character and a break (where a text may be cut); many do not.
std::string mixed_text(int lines, uint32_t seed) {
  static const char* words[] = {"the",
                                "Lamp",
                                "isn't",
                                "WE'LL",
                                "CamelCase",
                                "caf\xc3\xa9",
                                "2026",
                                "1234567",
                                "\xe4\xb8\xad\xe6\x96\x87",
                                "\xf0\x9f\x98\x80",
                                "x/y",
                                "(hello)",
                                "--",
                                "...",
                                "naïve",
                                "Über",
                                "a1b2",
                                "\xe3\x80\x82",
                                "- item"};
  static const char* ends[] = {
      ".\n",  "\n",    "  \n",           "\n\n",
      ",\n",  "\r\n",  " \n\n",          "!\n/",
      "\t\n", "\n   ", "\xe3\x80\x80\n", "\xe3\x80\x82\n"};
  std::mt19937 random(seed);
  const auto pick = [&random](int n) {
    return static_cast<int>(random() % static_cast<uint32_t>(n));
  };
  std::string text;
  for (int line = 0; line < lines; ++line) {
    const int length = 1 + pick(9);
    for (int w = 0; w < length; ++w) {
      text += words[pick(sizeof(words) / sizeof(words[0]))];
      text += w + 1 < length ? (pick(6) == 0 ? "  " : " ") : "";
    }
    text += ends[pick(sizeof(ends) / sizeof(ends[0]))];
  }
  return text;
}

// The parts of `text` as tokenized_text_windows() splits it.
std::pair<std::string, std::string> parts(const std::string& text,
                                          double validation_fraction) {
  const auto bytes =
      torch::from_blob(const_cast<char*>(text.data()),
                       {static_cast<int64_t>(text.size())}, torch::kUInt8);
  const auto split = static_cast<size_t>(
      lamp::data::text_split_point(bytes, validation_fraction));
  return {text.substr(0, split), text.substr(split)};
}

// Expects `folder`'s token files (ids of `width` bytes) to hold
// `tokenizer`'s ids of `text`'s two parts, split as train_gpt splits it.
void expect_parts_of(const std::string& folder, const Tokenizer& tokenizer,
                     const std::string& text, int width = 2) {
  const auto expected = parts(text, 0.1);
  EXPECT_EQ(ids_in(folder + "/train.bin", width),
            encoded(tokenizer, expected.first));
  EXPECT_EQ(ids_in(folder + "/val.bin", width),
            encoded(tokenizer, expected.second));
}

std::string base64(const std::string& bytes) {
  static const char* digits =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (const char c : bytes) {
    bits = (bits << 8) | static_cast<unsigned char>(c);
    count += 8;
    while (count >= 6) {
      out += digits[(bits >> (count - 6)) & 63];
      count -= 6;
    }
  }
  if (count > 0) {
    out += digits[(bits << (6 - count)) & 63];
  }
  while (out.size() % 4 != 0) {
    out += '=';
  }
  return out;
}

// A tiktoken file of `tokens`, each ranked by its place.
std::string tiktoken(const std::vector<std::string>& tokens) {
  std::string file;
  for (size_t id = 0; id < tokens.size(); ++id) {
    file += base64(tokens[id]) + " " + std::to_string(id) + "\n";
  }
  return file;
}

// The 256 bytes, then tokens of white space with line breaks: with them,
// a piece of white space cut in two where the split would not cut it
// encodes otherwise (GPT-2's `\s+(?!\S)` gives "  " then "\n" before a
// word, but "  \n" at a text's end).
std::vector<std::string> white_space_tokens() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
  }
  for (const char* token : {"  ", " \n", "\n\n", "\t\n", "\r\n", "  \n",
                            " \n\n", "\n ", "\n  ", "\n   ", ".\n", "!\n"}) {
    tokens.emplace_back(token);
  }
  return tokens;
}

// Each split lamp has, on the committed tokenizers Python trained, and
// on white_space_tokens().
std::vector<std::pair<std::string, Tokenizer>> byte_pair_tokenizers(
    const std::string& white_space_file) {
  return {
      {"GPT-2's white space",
       BytePairEncoding::load(white_space_file, BytePairSplit::kGpt2)},
      {"cl100k_base's white space",
       BytePairEncoding::load(white_space_file, BytePairSplit::kCl100k)},
      {"Llama 3's white space",
       BytePairEncoding::load(white_space_file, BytePairSplit::kLlama3)},
      {"o200k_base's white space",
       BytePairEncoding::load(white_space_file, BytePairSplit::kO200k)},
      {"GPT-2's", BytePairEncoding::load(kFiles + "/tokenizer.json")},
      {"Llama 3's", BytePairEncoding::load(kFiles + "/cl100k/tokenizer.json")},
      {"cl100k_base's",
       BytePairEncoding::load(kFiles + "/cl100k/tokens.tiktoken",
                              BytePairSplit::kCl100k)},
      {"o200k_base's",
       BytePairEncoding::load(kFiles + "/o200k/tokenizer.json")},
  };
}

TEST(WriteTokenFiles, OneTextGivesTheWholeTextsIdsHoweverItIsCut) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  Scratch scratch("one");
  const auto text = mixed_text(4000, 7);
  const auto input = scratch.write("text.txt", text);
  const auto expected_parts = parts(text, 0.1);
  const auto white_space =
      scratch.write("white_space.tiktoken", tiktoken(white_space_tokens()));
  int named_index = 0;
  for (const auto& named : byte_pair_tokenizers(white_space)) {
    const auto& tokenizer = named.second;
    const auto train = encoded(tokenizer, expected_parts.first);
    const auto validation = encoded(tokenizer, expected_parts.second);
    // Pieces of 64 bytes on 3 threads: hundreds of cuts; and one piece.
    for (const int64_t chunk : {int64_t{64}, int64_t{1} << 24}) {
      const auto out = scratch.path("out" + std::to_string(named_index) + "_" +
                                    std::to_string(chunk));
      const auto written =
          write_token_files(input, tokenizer, out,
                            TokenFileOptions().threads(3).chunk_bytes(chunk));
      SCOPED_TRACE(named.first + " split, pieces of " + std::to_string(chunk));
      EXPECT_EQ(ids_in(out + "/train.bin", 2), train);
      EXPECT_EQ(ids_in(out + "/val.bin", 2), validation);
      EXPECT_EQ(written.train_tokens, static_cast<int64_t>(train.size()));
      EXPECT_EQ(written.validation_tokens,
                static_cast<int64_t>(validation.size()));
      EXPECT_EQ(written.bytes, static_cast<int64_t>(text.size()));
      EXPECT_EQ(written.validation_bytes,
                static_cast<int64_t>(expected_parts.second.size()));
      EXPECT_EQ(written.documents, 1);
      EXPECT_EQ(written.end_of_document_id, -1);
      EXPECT_EQ(written.id_bytes, 2);
      EXPECT_EQ(written.threads, 3);
      EXPECT_EQ(scratch.list(out.substr(scratch.dir().size() + 1)),
                (std::vector<std::string>{"train.bin", "val.bin"}));
    }
    ++named_index;
  }
}

TEST(WriteTokenFiles, OneTextIsWhatTrainGptTrainsOn) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  // A folder of texts, joined in name order, the split inside a character:
  // the windows of the token files are those of tokenized_text_windows().
  Scratch scratch("train_gpt");
  scratch.write("texts/b.txt", mixed_text(300, 2));
  scratch.write("texts/a.txt", mixed_text(300, 1));
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  write_token_files(scratch.path("texts"), gpt2, scratch.path("tokens"),
                    TokenFileOptions().chunk_bytes(256).threads(2));
  const auto bytes = lamp::data::read_text_bytes(scratch.path("texts"));
  const auto text =
      lamp::data::tokenized_text_windows(bytes, "texts", gpt2, 16);
  const auto files = lamp::data::read_token_files(scratch.path("tokens"), 16,
                                                  gpt2.vocab_size());
  EXPECT_TRUE(torch::equal(files.train.inputs.to(torch::kLong),
                           text.train.inputs.to(torch::kLong)));
  EXPECT_TRUE(torch::equal(files.validation.targets.to(torch::kLong),
                           text.validation.targets.to(torch::kLong)));
}

TEST(WriteTokenFiles, SplitsAtTheStartOfACharacter) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  // "x" and 50 two-byte characters: 101 bytes, 90% of them end inside the
  // 45th character; the training part takes all of it.
  Scratch scratch("character");
  std::string text = "x";
  for (int k = 0; k < 50; ++k) {
    text += "\xc3\xa9";
  }
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  const auto written = write_token_files(scratch.write("text.txt", text), gpt2,
                                         scratch.path("out"),
                                         TokenFileOptions().chunk_bytes(64));
  EXPECT_EQ(written.validation_bytes, 10);
  EXPECT_EQ(ids_in(scratch.path("out/train.bin"), 2),
            encoded(gpt2, text.substr(0, 91)));
  EXPECT_EQ(ids_in(scratch.path("out/val.bin"), 2),
            encoded(gpt2, text.substr(91)));
}

TEST(WriteTokenFiles, KeepsATextWithoutAPlaceToCutWhole) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  // Lines that end in punctuation and CRLF or in white space, or start
  // with spaces, with no two words apart: nowhere to cut for the threads,
  // so each part is encoded whole.
  Scratch scratch("whole");
  std::string text;
  for (int k = 0; k < 3000; ++k) {
    text += k % 3 == 0   ? "\xe4\xb8\xad\xe6\x96\x87, text.\r\n"
            : k % 3 == 1 ? "12 items\xe3\x80\x80\n"
                         : "  indented \n";
  }
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  write_token_files(scratch.write("text.txt", text), gpt2, scratch.path("out"),
                    TokenFileOptions().chunk_bytes(64).threads(2));
  expect_parts_of(scratch.path("out"), gpt2, text);
}

TEST(WriteTokenFiles, EndsEachFileAsADocument) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  Scratch scratch("files");
  std::vector<std::string> documents;
  for (int k = 0; k < 5; ++k) {
    documents.push_back(mixed_text(40 + 10 * k, 100 + k));
    scratch.write("docs/" + std::to_string(k) + ".txt", documents.back());
  }
  scratch.write("docs/empty.txt", "");
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  const int64_t end = gpt2.end_of_text_id();
  ASSERT_GE(end, 0);
  EXPECT_EQ(gpt2.decode(torch::tensor({end})), "<|endoftext|>");
  // The last document starts past 80% of the bytes, the one before not.
  int64_t total = 0, before_last = 0;
  for (const auto& d : documents) {
    before_last = total;
    total += static_cast<int64_t>(d.size());
  }
  const double fraction = 1.0 - (static_cast<double>(before_last) - 0.5) /
                                    static_cast<double>(total);
  const auto written =
      write_token_files(scratch.path("docs"), gpt2, scratch.path("out"),
                        TokenFileOptions()
                            .documents(TextDocuments::kFiles)
                            .validation_fraction(fraction)
                            .chunk_bytes(100)
                            .threads(2));
  std::vector<int64_t> train, validation;
  for (size_t k = 0; k < documents.size(); ++k) {
    auto& part = k + 1 < documents.size() ? train : validation;
    const auto ids = encoded(gpt2, documents[k]);
    part.insert(part.end(), ids.begin(), ids.end());
    part.push_back(end);
  }
  EXPECT_EQ(ids_in(scratch.path("out/train.bin"), 2), train);
  EXPECT_EQ(ids_in(scratch.path("out/val.bin"), 2), validation);
  EXPECT_EQ(written.documents, 5); // the empty file is none
  EXPECT_EQ(written.validation_documents, 1);
  EXPECT_EQ(written.validation_bytes,
            static_cast<int64_t>(documents.back().size()));
  EXPECT_EQ(written.end_of_document_id, end);

  // Without the end-of-document id, and with another id.
  write_token_files(scratch.path("docs"), gpt2, scratch.path("plain"),
                    TokenFileOptions()
                        .documents(TextDocuments::kFiles)
                        .validation_fraction(fraction)
                        .end_documents(false));
  std::vector<int64_t> plain;
  for (size_t k = 0; k + 1 < documents.size(); ++k) {
    const auto ids = encoded(gpt2, documents[k]);
    plain.insert(plain.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(ids_in(scratch.path("plain/train.bin"), 2), plain);
  write_token_files(scratch.path("docs"), gpt2, scratch.path("seven"),
                    TokenFileOptions()
                        .documents(TextDocuments::kFiles)
                        .validation_fraction(fraction)
                        .end_of_document_id(7));
  const auto seven = ids_in(scratch.path("seven/val.bin"), 2);
  ASSERT_FALSE(seven.empty());
  EXPECT_EQ(seven.back(), 7);
}

TEST(WriteTokenFiles, ReadsJsonLinesByField) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  Scratch scratch("jsonl");
  // Escapes (a line break, é, an emoji as a surrogate pair), a blank line,
  // CRLF, another field before the text, an empty document.
  const std::vector<std::string> texts = {
      "First line\nsecond line.", "caf\xc3\xa9 \xf0\x9f\x98\x80 isn't it", "",
      "The last one, validating."};
  const std::string lines =
      "{\"body\": \"First line\\nsecond line.\", \"id\": 1}\n"
      "\n"
      "{\"id\": 2, \"body\": \"caf\\u00e9 \\ud83d\\ude00 isn't it\"}\r\n"
      "{\"body\": \"\"}\n"
      "   \n"
      "{\"body\": \"The last one, validating.\"}";
  const auto input = scratch.write("data.jsonl", lines);
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  const int64_t end = gpt2.end_of_text_id();
  const auto written =
      write_token_files(input, gpt2, scratch.path("out"),
                        TokenFileOptions()
                            .documents(TextDocuments::kJsonLines)
                            .json_field("body")
                            .validation_fraction(0.3));
  std::vector<int64_t> train, validation;
  for (size_t k = 0; k < texts.size(); ++k) {
    auto& part = k + 1 < texts.size() ? train : validation;
    const auto ids = encoded(gpt2, texts[k]);
    part.insert(part.end(), ids.begin(), ids.end());
    part.push_back(end);
  }
  EXPECT_EQ(ids_in(scratch.path("out/train.bin"), 2), train);
  EXPECT_EQ(ids_in(scratch.path("out/val.bin"), 2), validation);
  EXPECT_EQ(written.documents, 4);
  EXPECT_EQ(written.validation_documents, 1);
  int64_t bytes = 0;
  for (const auto& t : texts) {
    bytes += static_cast<int64_t>(t.size());
  }
  EXPECT_EQ(written.bytes, bytes);
  EXPECT_EQ(written.validation_bytes,
            static_cast<int64_t>(texts.back().size()));

  // Each bad line named by file and line; nothing written.
  const auto refused = [&](const std::string& second_line) {
    const auto path = scratch.write(
        "bad.jsonl", "{\"text\": \"fine\"}\n" + second_line + "\n");
    const auto message = error_of([&] {
      write_token_files(
          path, gpt2, scratch.path("bad"),
          TokenFileOptions().documents(TextDocuments::kJsonLines));
    });
    EXPECT_EQ(scratch.list("bad"), std::vector<std::string>{});
    return message;
  };
  auto message = refused("{\"text\": \"cut");
  EXPECT_NE(message.find("bad.jsonl' line 2 is not JSON"), std::string::npos)
      << message;
  message = refused("[\"text\"]");
  EXPECT_NE(message.find("line 2 is a JSON array, not an object"),
            std::string::npos)
      << message;
  message = refused("{\"body\": \"x\"}");
  EXPECT_NE(message.find("line 2 has no field \"text\"; name the field"),
            std::string::npos)
      << message;
  message = refused("{\"text\": 12}");
  EXPECT_NE(message.find("line 2's \"text\" is a JSON number, not a string"),
            std::string::npos)
      << message;
}

// `text` as a JSON string.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The token files written into `folder`: train.bin's bytes and val.bin's.
std::pair<std::string, std::string> files_in(const std::string& folder) {
  return {read(folder + "/train.bin"), read(folder + "/val.bin")};
}

TEST(WriteTokenFiles, CompressedInputGivesTheFilesOfItsText) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  using lamp::data::text_documents_for;
  using lamp_test::gzip;
  Scratch scratch("compressed");
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  // JSON Lines in three shards, each ending with its line break.
  std::vector<std::string> shards(3);
  for (int k = 0; k < 60; ++k) {
    shards[static_cast<size_t>(k / 20)] +=
        "{\"text\": " + json_string(mixed_text(3 + k % 7, 300 + k)) + "}\n";
  }
  const std::string lines = shards[0] + shards[1] + shards[2];
  const auto jsonl = TokenFileOptions()
                         .documents(TextDocuments::kJsonLines)
                         .validation_fraction(0.2)
                         .chunk_bytes(64)
                         .threads(2);
  write_token_files(scratch.write("data.jsonl", lines), gpt2,
                    scratch.path("plain"), jsonl);
  const auto expected = files_in(scratch.path("plain"));
  ASSERT_FALSE(expected.second.empty());
  std::vector<std::string> inputs = {
      scratch.write("data.jsonl.gz", gzip(lines)),
      // Two gzip members (`cat a.gz b.gz`), read as one text.
      scratch.write("members.jsonl.gz",
                    gzip(lines.substr(0, 1000)) + gzip(lines.substr(1000))),
      // A folder of shards: gzip, plain and (where lamp reads it) zstd.
      scratch.write("shards/a.jsonl.gz", gzip(shards[0])),
  };
  scratch.write("shards/b.jsonl", shards[1]);
#if LAMP_TEST_EXPECT_ZSTD
  scratch.write("shards/c.jsonl.zst", lamp_test::zstd(shards[2]));
  inputs.push_back(scratch.write("data.jsonl.zst", lamp_test::zstd(lines)));
#else
  scratch.write("shards/c.jsonl.gz", gzip(shards[2]));
#endif
  inputs[2] = scratch.path("shards");
  for (size_t k = 0; k < inputs.size(); ++k) {
    EXPECT_EQ(text_documents_for(inputs[k]), TextDocuments::kJsonLines)
        << inputs[k];
    const auto out = scratch.path("out" + std::to_string(k));
    const auto written = write_token_files(inputs[k], gpt2, out, jsonl);
    EXPECT_EQ(files_in(out), expected) << inputs[k];
    EXPECT_EQ(written.documents, 60) << inputs[k];
  }

  // One text and files: the same files as from the text itself.
  const auto text = mixed_text(400, 7);
  const auto one = TokenFileOptions().chunk_bytes(64).threads(2);
  write_token_files(scratch.write("text.txt", text), gpt2, scratch.path("text"),
                    one);
  write_token_files(scratch.write("text.txt.gz", gzip(text)), gpt2,
                    scratch.path("text-gz"), one);
  EXPECT_EQ(files_in(scratch.path("text-gz")), files_in(scratch.path("text")));
  EXPECT_EQ(text_documents_for(scratch.path("text.txt.gz")),
            TextDocuments::kOneText);
  const auto files = TokenFileOptions()
                         .documents(TextDocuments::kFiles)
                         .validation_fraction(0.3);
  for (int k = 0; k < 4; ++k) {
    const auto document = mixed_text(20 + k, 40 + k);
    scratch.write("docs/" + std::to_string(k) + ".txt", document);
    scratch.write("docs-gz/" + std::to_string(k) + ".txt",
                  k % 2 == 0 ? gzip(document) : document);
  }
  write_token_files(scratch.path("docs"), gpt2, scratch.path("docs-out"),
                    files);
  write_token_files(scratch.path("docs-gz"), gpt2, scratch.path("docs-gz-out"),
                    files);
  EXPECT_EQ(files_in(scratch.path("docs-gz-out")),
            files_in(scratch.path("docs-out")));
  EXPECT_EQ(text_documents_for(scratch.path("docs")), TextDocuments::kOneText);
  EXPECT_EQ(text_documents_for(scratch.path("data.json.gz")),
            TextDocuments::kJsonLines);
  EXPECT_EQ(text_documents_for(scratch.path("data.json")),
            TextDocuments::kOneText);

  // Two gzip members: the size the last one's header gives is not the
  // text's, so the text is counted and written again (the files above are
  // the text's). Counting reports a size of -1; a stop there, or anywhere,
  // leaves no file.
  std::vector<int64_t> totals;
  const auto stopped = [&](const std::string& input, const std::string& out) {
    totals.clear();
    const auto message = error_of([&] {
      write_token_files(
          input, gpt2, out,
          TokenFileOptions(jsonl).progress([&](int64_t, int64_t total) {
            totals.push_back(total);
            TORCH_CHECK(total >= 0, "stopped by a test");
          }));
    });
    EXPECT_NE(message.find("stopped by a test"), std::string::npos) << message;
    EXPECT_FALSE(totals.empty());
    EXPECT_EQ(totals.back(), -1);
    EXPECT_EQ(scratch.list(out.substr(scratch.dir().size() + 1)),
              std::vector<std::string>{});
  };
  stopped(inputs[1], scratch.path("stopped"));
  // The last member's size, the guess, is outgrown before the file's end:
  // the files are written again from there, and no batch is written past
  // the guess (progress never reports more bytes read than the size it
  // reports). The guess is the last 60% of the text, at least the file's
  // size; one text reports the guess in its first try.
  for (const bool one_text : {false, true}) {
    const auto& whole = one_text ? text : lines;
    const auto cut = whole.size() * 2 / 5;
    const auto input =
        scratch.write(one_text ? "big-last.txt.gz" : "big-last.jsonl.gz",
                      gzip(whole.substr(0, cut)) + gzip(whole.substr(cut)));
    ASSERT_GE(whole.size() - cut, read(input).size());
    const auto out = scratch.path(one_text ? "big-last" : "big-last-jsonl");
    std::vector<std::pair<int64_t, int64_t>> reported;
    write_token_files(input, gpt2, out,
                      TokenFileOptions(one_text ? one : jsonl)
                          .progress([&](int64_t done, int64_t total) {
                            reported.emplace_back(done, total);
                          }));
    EXPECT_EQ(files_in(out),
              files_in(scratch.path(one_text ? "text" : "plain")))
        << input;
    bool guessed = false;
    for (const auto& call : reported) {
      EXPECT_TRUE(call.second < 0 || call.first <= call.second)
          << input << ": " << call.first << " bytes read of " << call.second;
      guessed |= call.second == static_cast<int64_t>(whole.size() - cut);
    }
    EXPECT_TRUE(guessed || !one_text) << "the guess was not taken";
    EXPECT_EQ(reported.back(),
              std::make_pair(static_cast<int64_t>(whole.size()),
                             static_cast<int64_t>(whole.size())))
        << input;
  }
#if LAMP_TEST_EXPECT_ZSTD
  // A zstd stream without its size is counted first, before the output
  // folder is made.
  const auto streamed =
      scratch.write("streamed.jsonl.zst", lamp_test::zstd_streamed(lines));
  stopped(streamed, scratch.path("stopped-zstd"));
  EXPECT_EQ(totals, std::vector<int64_t>{-1});
  EXPECT_EQ(::access(scratch.path("stopped-zstd").c_str(), F_OK), -1);
  write_token_files(streamed, gpt2, scratch.path("streamed"), jsonl);
  EXPECT_EQ(files_in(scratch.path("streamed")), expected);
#endif

  // A damaged shard is named; nothing is written.
  const auto good = gzip(shards[1]);
  scratch.write("damaged/a.jsonl", shards[0]);
  scratch.write("damaged/b.jsonl.gz", good.substr(0, good.size() - 9));
  const auto damaged = error_of([&] {
    write_token_files(scratch.path("damaged"), gpt2,
                      scratch.path("damaged-out"), jsonl);
  });
  EXPECT_NE(damaged.find("b.jsonl.gz' is truncated"), std::string::npos)
      << damaged;
  EXPECT_EQ(::access(scratch.path("damaged-out").c_str(), F_OK), -1);
}

TEST(WriteTokenFiles, DrawsTheValidatingDocumentsAtRandom) {
  using lamp::data::drawn_for_validation;
  using lamp::data::ValidationDraw;
  // SplitMix64's first outputs for seed 0 (Vigna's splitmix64.c:
  // 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f) are
  // u = 0.88331, 0.43153, 0.02643: the third document validates at 0.0265,
  // not at 0.0264.
  EXPECT_FALSE(drawn_for_validation(0, 0.8833, 0));
  EXPECT_TRUE(drawn_for_validation(0, 0.8834, 0));
  EXPECT_FALSE(drawn_for_validation(1, 0.4315, 0));
  EXPECT_TRUE(drawn_for_validation(1, 0.4316, 0));
  EXPECT_FALSE(drawn_for_validation(2, 0.0264, 0));
  EXPECT_TRUE(drawn_for_validation(2, 0.0265, 0));
  // The documents of 40 that validate at 0.3, computed in Python from the
  // formula in the header; the last seed wraps around 2^64.
  const std::vector<std::pair<uint64_t, std::vector<int64_t>>> drawn = {
      {0, {2, 4, 6, 8, 18, 27, 31, 32, 33, 36, 37}},
      {2357, {6, 15, 17, 19, 23, 37}},
      {UINT64_MAX, {2, 7, 9, 10, 12, 14, 17, 18, 23, 24, 29, 30, 36, 37, 38}},
  };
  const auto draw = [](uint64_t seed, int64_t n, double fraction) {
    std::vector<int64_t> validating;
    for (int64_t d = 0; d < n; ++d) {
      if (drawn_for_validation(d, fraction, seed)) {
        validating.push_back(d);
      }
    }
    return validating;
  };
  for (const auto& seed_drawn : drawn) {
    EXPECT_EQ(draw(seed_drawn.first, 40, 0.3), seed_drawn.second)
        << "seed " << seed_drawn.first;
  }
  // About the fraction: 200,000 documents at 0.1 give 20,000 with a
  // standard deviation of 134; 5 of them allowed.
  const auto many = static_cast<double>(draw(11, 200000, 0.1).size());
  EXPECT_NEAR(many, 20000, 5 * 134.2);
  EXPECT_NE(
      error_of([] { drawn_for_validation(-1, 0.5, 0); }).find("must be >= 0"),
      std::string::npos);

  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  Scratch scratch("random");
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  const int64_t end = gpt2.end_of_text_id();
  // 40 documents: as JSON Lines in two shards (the second gzip-compressed),
  // with blank lines that are no documents; and as a folder of files, one
  // of them empty (no document either).
  std::vector<std::string> texts, shards(2);
  for (int k = 0; k < 40; ++k) {
    texts.push_back(mixed_text(2 + k % 5, 900 + k));
    shards[k < 25 ? 0 : 1] += (k % 7 == 3 ? "\n  \n" : "") +
                              std::string("{\"text\": ") +
                              json_string(texts.back()) + "}\n";
    scratch.write("files/" + std::to_string(100 + k) + ".txt", texts.back());
  }
  scratch.write("files/120a.txt", "");
  scratch.write("shards/a.jsonl", shards[0]);
  scratch.write("shards/b.jsonl.gz", lamp_test::gzip(shards[1]));
  for (const auto& seed_drawn : drawn) {
    std::vector<int64_t> train, validation;
    int64_t validation_bytes = 0;
    for (int64_t k = 0; k < 40; ++k) {
      const auto& validating = seed_drawn.second;
      const bool held_out = std::find(validating.begin(), validating.end(),
                                      k) != validating.end();
      auto& part = held_out ? validation : train;
      const auto ids = encoded(gpt2, texts[static_cast<size_t>(k)]);
      part.insert(part.end(), ids.begin(), ids.end());
      part.push_back(end);
      validation_bytes +=
          held_out ? static_cast<int64_t>(texts[static_cast<size_t>(k)].size())
                   : 0;
    }
    for (const auto documents :
         {TextDocuments::kJsonLines, TextDocuments::kFiles}) {
      for (const int64_t threads : {1, 3}) {
        const auto name = "s" + std::to_string(seed_drawn.first) + "-" +
                          lamp::data::text_documents_name(documents) + "-" +
                          std::to_string(threads);
        const auto written = write_token_files(
            scratch.path(documents == TextDocuments::kFiles ? "files"
                                                            : "shards"),
            gpt2, scratch.path(name),
            TokenFileOptions()
                .documents(documents)
                .validation_fraction(0.3)
                .validation_draw(ValidationDraw::kRandom)
                .validation_seed(seed_drawn.first)
                .chunk_bytes(64)
                .threads(threads));
        EXPECT_EQ(ids_in(scratch.path(name + "/train.bin"), 2), train) << name;
        EXPECT_EQ(ids_in(scratch.path(name + "/val.bin"), 2), validation)
            << name;
        EXPECT_EQ(written.documents, 40) << name;
        EXPECT_EQ(written.validation_documents,
                  static_cast<int64_t>(seed_drawn.second.size()))
            << name;
        EXPECT_EQ(written.validation_bytes, validation_bytes) << name;
      }
    }
  }

  // One text has no documents to draw; a draw that leaves a part empty
  // names the seed. Nothing is written.
  const auto random = TokenFileOptions()
                          .validation_draw(ValidationDraw::kRandom)
                          .validation_seed(2357);
  auto message = error_of([&] {
    write_token_files(scratch.path("files/100.txt"), gpt2, scratch.path("one"),
                      random);
  });
  EXPECT_NE(message.find("a random draw holds out whole documents, and one "
                         "text has none"),
            std::string::npos)
      << message;
  message = error_of([&] {
    write_token_files(scratch.path("shards"), gpt2, scratch.path("none"),
                      TokenFileOptions(random)
                          .documents(TextDocuments::kJsonLines)
                          .validation_fraction(0.001));
  });
  EXPECT_NE(message.find("40 for training and 0 for validation (each drawn "
                         "with probability 0.001, seed 2357); each part needs "
                         "one. Give more documents, another validation "
                         "fraction or seed"),
            std::string::npos)
      << message;
  EXPECT_EQ(scratch.list("one"), std::vector<std::string>{});
  EXPECT_EQ(scratch.list("none"), std::vector<std::string>{});
}

TEST(WriteTokenFiles, WritesUint32IdsAboveUint16s) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  // A tiktoken file of the 256 bytes and every pair of bytes (65,792
  // tokens), ranked so that the pairs led by 'e' take the ids above 65,535.
  Scratch scratch("uint32");
  std::vector<std::string> tokens(256 + 65536);
  for (int b = 0; b < 256; ++b) {
    tokens[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
  }
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const int rank = 256 + ((a + 256 - 'e' - 1) % 256) * 256 + b;
      tokens[static_cast<size_t>(rank)] = {static_cast<char>(a),
                                           static_cast<char>(b)};
    }
  }
  const Tokenizer wide =
      BytePairEncoding::load(scratch.write("wide.tiktoken", tiktoken(tokens)));
  ASSERT_GT(wide.vocab_size(), 65536);
  const auto text = "eeee the free tree\neek, seen\n" + mixed_text(50, 3);
  const auto input = scratch.write("text.txt", text);
  const auto written = write_token_files(input, wide, scratch.path("out"),
                                         TokenFileOptions().chunk_bytes(64));
  EXPECT_EQ(written.id_bytes, 4);
  expect_parts_of(scratch.path("out"), wide, text, 4);
  const auto train = ids_in(scratch.path("out/train.bin"), 4);
  EXPECT_GT(*std::max_element(train.begin(), train.end()), 65535);
  const auto data =
      lamp::data::read_token_files(scratch.path("out"), 8, wide.vocab_size());
  EXPECT_EQ(data.id_bytes, 4);
}

TEST(WriteTokenFiles, RefusesBadInputAndOverwritesNothing) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  Scratch scratch("bad");
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  const auto text = scratch.write("text.txt", mixed_text(200, 5));
  const auto expect_error =
      [&](const std::string& path, const std::string& folder,
          const TokenFileOptions& options, const std::string& part) {
        const auto message = error_of([&] {
          write_token_files(path, gpt2, scratch.path(folder), options);
        });
        EXPECT_NE(message.find(part), std::string::npos)
            << "expected '" << part << "' in: " << message;
      };
  expect_error(scratch.path("missing.txt"), "a", TokenFileOptions(),
               "missing.txt' does not exist; give a text file or a folder");
  expect_error(scratch.write("empty.txt", ""), "a", TokenFileOptions(),
               "empty.txt' is empty");
  // A binary file: refused, with nothing left in the folder.
  std::string binary = mixed_text(2000, 9);
  binary[binary.size() / 2] = '\0';
  expect_error(scratch.write("binary.txt", binary), "b",
               TokenFileOptions().chunk_bytes(64),
               "binary.txt' looks binary (a NUL byte at offset");
  EXPECT_EQ(scratch.list("b"), std::vector<std::string>{});
  expect_error(text, "c", TokenFileOptions().validation_fraction(1.0),
               "validation_fraction must be in (0, 1)");
  expect_error(text, "c", TokenFileOptions().threads(-1), "threads must be");
  expect_error(text, "c", TokenFileOptions().chunk_bytes(8),
               "chunk_bytes must be >= 64");
  expect_error(text, "c",
               TokenFileOptions()
                   .documents(TextDocuments::kFiles)
                   .end_of_document_id(gpt2.vocab_size()),
               "is not below");
  // One document cannot fill both parts.
  expect_error(text, "d", TokenFileOptions().documents(TextDocuments::kFiles),
               "holds 1 document, 1 for training and 0 for validation");
  EXPECT_EQ(scratch.list("d"), std::vector<std::string>{});
  expect_error(text, "no/such/folder", TokenFileOptions(),
               "does not exist, nor does its parent");
  // Token files already there are kept as they were.
  scratch.write("kept/train.bin", "old");
  expect_error(text, "kept", TokenFileOptions(),
               "kept/train.bin' exists; token files are never overwritten");
  EXPECT_EQ(read(scratch.path("kept/train.bin")), "old");
  EXPECT_EQ(scratch.list("kept"), std::vector<std::string>{"train.bin"});
  expect_error(text, "text.txt", TokenFileOptions(), "is not a folder");
}

TEST(WriteTokenFiles, ReportsProgressAndStopsWhenItThrows) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  Scratch scratch("progress");
  const auto text = mixed_text(3000, 4);
  const auto input = scratch.write("text.txt", text);
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  std::vector<std::pair<int64_t, int64_t>> calls;
  write_token_files(input, gpt2, scratch.path("out"),
                    TokenFileOptions().chunk_bytes(1024).threads(2).progress(
                        [&](int64_t done, int64_t total) {
                          calls.emplace_back(done, total);
                        }));
  // Batches of 2 threads x 2 pieces of 1 KiB: many calls, the bytes read
  // growing to the whole input.
  ASSERT_GT(calls.size(), 10u);
  for (size_t k = 1; k < calls.size(); ++k) {
    EXPECT_GE(calls[k].first, calls[k - 1].first);
  }
  EXPECT_EQ(calls.back().first, static_cast<int64_t>(text.size()));
  EXPECT_EQ(calls.back().second, static_cast<int64_t>(text.size()));
  // A stop half way: the error is the callback's, and nothing is written.
  const auto message = error_of([&] {
    write_token_files(input, gpt2, scratch.path("stopped"),
                      TokenFileOptions().chunk_bytes(1024).progress(
                          [&](int64_t done, int64_t total) {
                            TORCH_CHECK(done * 2 < total, "stopped by a test");
                          }));
  });
  EXPECT_NE(message.find("stopped by a test"), std::string::npos) << message;
  EXPECT_EQ(scratch.list("stopped"), std::vector<std::string>{});
}

TEST(WriteTokenFiles, SentencePieceEncodesEachPartWhole) {
  if (!lamp::data::sentencepiece_available()) {
    GTEST_SKIP() << "lamp was built without SentencePiece";
  }
  Scratch scratch("sentencepiece");
  const auto text = mixed_text(1500, 11);
  const Tokenizer model = lamp::data::train_sentencepiece(
      text, lamp::data::SentencePieceTrainOptions().vocab_size(400),
      "the text");
  EXPECT_EQ(model.end_of_text_id(), 2); // </s>
  const auto input = scratch.write("text.txt", text);
  write_token_files(input, model, scratch.path("out"),
                    TokenFileOptions().chunk_bytes(64).threads(2));
  expect_parts_of(scratch.path("out"), model, text);
}

TEST(WriteTokenFiles, NamesTheEndOfTextOfEachTokenizer) {
  const Tokenizer gpt2 = BytePairEncoding::load(kFiles + "/tokenizer.json");
  EXPECT_EQ(gpt2.byte_pair().special_id("<|endoftext|>"),
            gpt2.end_of_text_id());
  EXPECT_EQ(gpt2.byte_pair().special_id("<|nothing|>"), -1);
  // GPT-2's own vocab.json (as its encoder.json) lists <|endoftext|> among
  // its tokens, where the tokenizer.json names it an added token: the same
  // id.
  const Tokenizer vocab = BytePairEncoding::load(kFiles + "/vocab.json");
  EXPECT_EQ(vocab.end_of_text_id(), 599);
  EXPECT_EQ(vocab.end_of_text_id(), gpt2.end_of_text_id());
  // The tiktoken file's <|endoftext|> is the id after its tokens.
  const Tokenizer tiktoken =
      BytePairEncoding::load(kFiles + "/tokens.tiktoken");
  EXPECT_EQ(tiktoken.end_of_text_id(), tiktoken.vocab_size() - 1);
  // Llama 3's name for it, <|end_of_text|>: the Llama 3 file with its
  // special token renamed.
  Scratch scratch("llama3");
  auto json = read(kFiles + "/cl100k/tokenizer.json");
  const std::string gpt2_name = "<|endoftext|>";
  for (size_t at = json.find(gpt2_name); at != std::string::npos;
       at = json.find(gpt2_name, at)) {
    json.replace(at, gpt2_name.size(), "<|end_of_text|>");
  }
  const Tokenizer llama3 =
      BytePairEncoding::load(scratch.write("tokenizer.json", json));
  EXPECT_EQ(llama3.byte_pair().special_id(gpt2_name), -1);
  const auto id = llama3.end_of_text_id();
  ASSERT_GE(id, 0);
  EXPECT_EQ(llama3.decode(torch::tensor({id})), "<|end_of_text|>");
  EXPECT_EQ(lamp::data::text_documents_name(TextDocuments::kJsonLines),
            "jsonl");
  // A missing file is named with every kind of tokenizer file.
  const auto message =
      error_of([] { Tokenizer::load("/nonexistent/gpt2.tiktoken"); });
  EXPECT_NE(message.find("gpt2.tiktoken' does not exist; give a tokenizer: a "
                         "tiktoken file, a Hugging Face tokenizer.json"),
            std::string::npos)
      << message;
}

} // namespace
