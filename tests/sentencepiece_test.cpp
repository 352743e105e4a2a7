// lamp::data::SentencePiece: training, encoding and decoding (the round
// trip), the model file both ways, damaged files and bad options refused by
// name, and a text cut into windows of token ids.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using lamp_test::BitEqual;
using lamp_test::error_of;

// A text of many lines with what a byte-level corpus has: runs of spaces,
// tabs, blank lines, digits, punctuation and some non-ASCII letters.
std::string corpus(int lines) {
  static const char* words[] = {
      "the",       "lamp",  "trains", "a",      "model",   "with",  "mixed",
      "precision", "and",   "its",    "master", "weights", "stay",  "in",
      "float",     "while", "café",   "naïve",  "über",    "over",  "loss",
      "scale",     "grows", "when",   "steps",  "are",     "finite"};
  const int count = static_cast<int>(sizeof(words) / sizeof(words[0]));
  std::string text;
  uint32_t state = 12345;
  for (int line = 0; line < lines; ++line) {
    const int length = 3 + line % 9;
    for (int w = 0; w < length; ++w) {
      state = state * 1664525u + 1013904223u;
      text += words[(state >> 8) % count];
      text += w + 1 < length ? ((state >> 20) % 7 == 0 ? "  " : " ") : "";
    }
    text += line % 5 == 0 ? ", " + std::to_string(line * 37) + ".\n" : "\n";
    if (line % 11 == 0) {
      text += "\tindented line\n\n";
    }
  }
  return text;
}

// A trained model shared by the tests (training takes a moment).
const lamp::data::SentencePiece& model() {
  static const auto trained = lamp::data::train_sentencepiece(
      corpus(2000), lamp::data::SentencePieceTrainOptions().vocab_size(400),
      "the corpus");
  return trained;
}

std::string scratch(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/lamp_sp_" + info->name() + "_" +
         std::to_string(::getpid()) + "_" + name;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

#define LAMP_SKIP_WITHOUT_SENTENCEPIECE()                          \
  do {                                                             \
    if (!lamp::data::sentencepiece_available()) {                  \
      GTEST_SKIP() << "this lamp was built without SentencePiece"; \
    }                                                              \
  } while (0)

} // namespace

// The build's answer is the configuration's (LAMP_WITH_SENTENCEPIECE); a
// lamp without it refuses by name, pointing at the package.
TEST(SentencePiece, AvailableAsConfigured) {
  EXPECT_EQ(lamp::data::sentencepiece_available(),
            LAMP_TEST_EXPECT_SENTENCEPIECE != 0);
  if (!lamp::data::sentencepiece_available()) {
    EXPECT_NE(error_of([] { lamp::data::SentencePiece::load("x.model"); })
                  .find("built without SentencePiece; install it (apt-get "
                        "install libsentencepiece-dev"),
              std::string::npos);
  }
}

// decode(encode(text)) is the text, byte for byte: newlines (which training
// never sees), runs of spaces, tabs, and characters the model has no piece
// for (byte fallback); ids are int64 below vocab_size(), and the common
// words take one piece each.
TEST(SentencePiece, TrainedModelGivesTheTextBack) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  const auto& tokenizer = model();
  EXPECT_EQ(tokenizer.vocab_size(), 400);
  EXPECT_EQ(tokenizer.origin(), "a model trained from the corpus");
  EXPECT_EQ(tokenizer.describe(),
            "400 pieces, 256 of them bytes (byte "
            "fallback)");
  const std::vector<std::string> texts = {corpus(50),
                                          "\n",
                                          "two  spaces\tand a tab\n\n",
                                          " leading space",
                                          "日本語 and ünïcödé unseen ✓",
                                          "digits 1234567890"};
  for (const auto& text : texts) {
    const auto ids = tokenizer.encode(text);
    EXPECT_EQ(ids.scalar_type(), torch::kLong);
    EXPECT_EQ(ids.dim(), 1);
    ASSERT_GT(ids.numel(), 0) << text;
    EXPECT_GE(ids.min().item<int64_t>(), 0);
    EXPECT_LT(ids.max().item<int64_t>(), 400);
    EXPECT_EQ(tokenizer.decode(ids), text);
    // Any integer type, any device the tensor is on.
    EXPECT_EQ(tokenizer.decode(ids.to(torch::kShort)), text);
  }
  // Pieces longer than a byte: the corpus's words cost fewer ids than bytes.
  const auto text = corpus(200);
  EXPECT_LT(tokenizer.encode(text).numel() * 2,
            static_cast<int64_t>(text.size()));
  EXPECT_EQ(tokenizer.encode("").numel(), 0);
  EXPECT_EQ(tokenizer.decode(torch::empty({0}, torch::kLong)), "");
}

// Ids the model does not have (a vocabulary padded beyond its pieces) show
// as <id> between the text of the others.
TEST(SentencePiece, DecodesUnknownIdsAsNumbers) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  const auto& tokenizer = model();
  auto ids = tokenizer.encode("the lamp");
  auto mixed = torch::cat({ids, torch::tensor({400, -1}, torch::kLong), ids});
  const auto text = tokenizer.decode(mixed);
  EXPECT_EQ(text.find("the lamp<400><-1>"), 0u) << text;
  EXPECT_NE(text.find("the lamp", 10), std::string::npos) << text;
  EXPECT_NE(error_of([&] {
              tokenizer.decode(torch::ones({2, 2}));
            }).find("ids must be integers [n]"),
            std::string::npos);
}

// save() writes the .model file that load() (and spm_encode) read: the same
// bytes, the same ids; from_serialized() takes the bytes themselves.
TEST(SentencePiece, SavesAndLoadsTheModelFile) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  const auto path = scratch("m.model");
  model().save(path);
  EXPECT_EQ(read_file(path), model().serialized());
  const auto loaded = lamp::data::SentencePiece::load(path);
  EXPECT_EQ(loaded.origin(), path);
  EXPECT_EQ(loaded.vocab_size(), 400);
  const auto text = corpus(30);
  EXPECT_TRUE(BitEqual(loaded.encode(text), model().encode(text)));
  const auto copy =
      lamp::data::SentencePiece::from_serialized(model().serialized(), "bytes");
  EXPECT_TRUE(BitEqual(copy.encode(text), model().encode(text)));
  std::remove(path.c_str());
}

// A missing file, a folder, an empty file, a truncated model and a text
// file are each refused naming the file and what to give instead.
TEST(SentencePiece, RefusesWhatIsNotAModel) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  using lamp::data::SentencePiece;
  const auto missing = scratch("missing.model");
  auto message = error_of([&] { SentencePiece::load(missing); });
  EXPECT_NE(message.find("'" + missing +
                         "' does not exist; give a "
                         "SentencePiece model"),
            std::string::npos)
      << message;
  message = error_of([] { SentencePiece::load(::testing::TempDir()); });
  EXPECT_NE(message.find("is not a regular file"), std::string::npos)
      << message;
  const auto empty = scratch("empty.model");
  write_file(empty, "");
  message = error_of([&] { SentencePiece::load(empty); });
  EXPECT_NE(message.find("'" + empty + "' is empty"), std::string::npos)
      << message;
  const auto truncated = scratch("truncated.model");
  const auto bytes = model().serialized();
  write_file(truncated, bytes.substr(0, bytes.size() / 2));
  message = error_of([&] { SentencePiece::load(truncated); });
  EXPECT_NE(message.find("'" + truncated +
                         "' is not a SentencePiece model, or a damaged one"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("not the .vocab beside it"), std::string::npos);
  const auto text = scratch("vocab.txt");
  write_file(text, "<unk>\t0\n<s>\t0\n</s>\t0\n▁the\t-1.5\n");
  message = error_of([&] { SentencePiece::load(text); });
  EXPECT_NE(message.find("is not a SentencePiece model"), std::string::npos)
      << message;
  for (const auto& path : {empty, truncated, text}) {
    std::remove(path.c_str());
  }
  // An empty SentencePiece is no model.
  EXPECT_NE(error_of([] { SentencePiece().encode("a"); }).find("no model"),
            std::string::npos);
}

// Training refuses an empty text, a vocabulary too small for the control
// and byte pieces, one too large for the text (SentencePiece's own limit in
// the message), and options it does not know.
TEST(SentencePiece, TrainingRefusesBadOptions) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  using lamp::data::SentencePieceTrainOptions;
  using lamp::data::train_sentencepiece;
  auto message = error_of([] { train_sentencepiece("\n\n", {}, "x.txt"); });
  EXPECT_NE(message.find("x.txt is empty (no line with text)"),
            std::string::npos)
      << message;
  message = error_of([] {
    train_sentencepiece(corpus(10),
                        SentencePieceTrainOptions().vocab_size(259));
  });
  EXPECT_NE(message.find("vocab_size 259 is out of range; give at least 260"),
            std::string::npos)
      << message;
  message = error_of([] {
    train_sentencepiece(corpus(10),
                        SentencePieceTrainOptions().vocab_size(100000), "t");
  });
  // SentencePiece's bounds in lamp's words, not its status (a source line,
  // an option lamp does not have).
  EXPECT_NE(message.find("100000 pieces are more than t ("), std::string::npos)
      << message;
  EXPECT_NE(message.find("Give a vocabulary of at most "), std::string::npos)
      << message;
  EXPECT_EQ(message.find("trainer_interface"), std::string::npos) << message;
  message = error_of([] {
    train_sentencepiece(corpus(10), SentencePieceTrainOptions().vocab_size(260),
                        "t");
  });
  EXPECT_NE(message.find("260 pieces are too few for t ("), std::string::npos)
      << message;
  EXPECT_NE(message.find("its characters and the 256 byte pieces need "),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("character_coverage"), std::string::npos) << message;
  message = error_of([] {
    train_sentencepiece(corpus(10),
                        SentencePieceTrainOptions().model_type("word"));
  });
  EXPECT_NE(message.find("model_type must be \"bpe\" or \"unigram\""),
            std::string::npos)
      << message;
  // unigram trains too, and gives the text back as well.
  const auto unigram = train_sentencepiece(
      corpus(300),
      SentencePieceTrainOptions().vocab_size(300).model_type("unigram"));
  const auto text = corpus(20);
  EXPECT_EQ(unigram.decode(unigram.encode(text)), text);
}

// A line whose first 16 KiB hold no start of a UTF-8 character (bytes
// that are not UTF-8 text) is still cut into pieces the trainer can take,
// rather than never moving past it; the text around it trains as ever.
TEST(SentencePiece, TrainsPastALongRunOfContinuationBytes) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  const auto text =
      corpus(300) + "ab\n" + std::string(20000, '\xA0') + "\n" + corpus(100);
  const auto tokenizer = lamp::data::train_sentencepiece(
      text, lamp::data::SentencePieceTrainOptions().vocab_size(300), "t");
  EXPECT_EQ(tokenizer.vocab_size(), 300);
  const auto words = corpus(20);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(words)), words);
}

// The split point moves past a character's continuation bytes; each part
// is encoded on its own and cut by text_windows(); a part too short for the
// context is refused with the counts; and a tokenizer that cannot give the
// text back (no byte fallback, a character it never saw) is warned about,
// naming the first difference.
TEST(SentencePiece, CutsATextIntoWindowsOfTokenIds) {
  LAMP_SKIP_WITHOUT_SENTENCEPIECE();
  // 17 ASCII bytes, "é" (bytes 17 and 18), "b": 90% of 20 bytes falls on
  // é's second byte, and the split moves past it.
  std::string text = std::string(17, 'a') + "é" + "b";
  ASSERT_EQ(text.size(), 20u);
  auto bytes = torch::from_blob(text.data(), {20}, torch::kUInt8).clone();
  EXPECT_EQ(lamp::data::text_split_point(bytes, 0.1), 19);
  EXPECT_EQ(lamp::data::text_split_point(bytes, 0.15), 17); // é's first
  // Not UTF-8 (a run of continuation bytes): at most 3 steps.
  auto stray = torch::full({20}, 'a', torch::kUInt8);
  stray.slice(0, 16, 20).fill_(0x80);
  EXPECT_EQ(lamp::data::text_split_point(stray, 0.2), 19);
  EXPECT_NE(error_of([&] {
              lamp::data::text_split_point(bytes, 1.0);
            }).find("validation_fraction must be in (0, 1)"),
            std::string::npos);

  const auto& tokenizer = model();
  const auto whole = corpus(400);
  const auto all =
      torch::from_blob(const_cast<char*>(whole.data()),
                       {static_cast<int64_t>(whole.size())}, torch::kUInt8)
          .clone();
  std::vector<std::string> warnings;
  lamp::WarningSink sink(
      [&](const std::string& message) { warnings.push_back(message); });
  const auto data =
      lamp::data::tokenized_text_windows(all, "corpus.txt", tokenizer, 16);
  EXPECT_TRUE(warnings.empty());
  const int64_t split = lamp::data::text_split_point(all, 0.1);
  EXPECT_EQ(data.bytes, static_cast<int64_t>(whole.size()));
  EXPECT_EQ(data.train_bytes, split);
  EXPECT_EQ(data.validation_bytes, data.bytes - split);
  const auto train_ids = tokenizer.encode(whole.substr(0, split));
  const auto validation_ids = tokenizer.encode(whole.substr(split));
  EXPECT_EQ(data.train_tokens, train_ids.numel());
  EXPECT_EQ(data.validation_tokens, validation_ids.numel());
  const auto expected = lamp::data::text_windows(train_ids, 16);
  EXPECT_EQ(data.train.inputs.scalar_type(), torch::kShort);
  EXPECT_TRUE(BitEqual(data.train.inputs.to(torch::kLong), expected.inputs));
  EXPECT_TRUE(BitEqual(data.train.targets.to(torch::kLong), expected.targets));
  const auto expected_validation = lamp::data::text_windows(validation_ids, 16);
  EXPECT_TRUE(BitEqual(data.validation.inputs.to(torch::kLong),
                       expected_validation.inputs));

  auto message = error_of([&] {
    lamp::data::tokenized_text_windows(all, "corpus.txt", tokenizer, 100000);
  });
  EXPECT_NE(message.find("'corpus.txt' holds " + std::to_string(whole.size()) +
                         " bytes, which 'a model trained from the corpus' "
                         "encodes into " +
                         std::to_string(data.train_tokens) +
                         " tokens for training and " +
                         std::to_string(data.validation_tokens) +
                         " for validation, but each part needs at least "
                         "context + 1 = 100001 tokens"),
            std::string::npos)
      << message;

  const auto no_bytes = lamp::data::train_sentencepiece(
      corpus(300),
      lamp::data::SentencePieceTrainOptions().vocab_size(200).byte_fallback(
          false));
  const std::string odd = "the lamp 日本 the lamp\n" + corpus(100);
  const auto odd_bytes =
      torch::from_blob(const_cast<char*>(odd.data()),
                       {static_cast<int64_t>(odd.size())}, torch::kUInt8)
          .clone();
  lamp::data::tokenized_text_windows(odd_bytes, "odd.txt", no_bytes, 8);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("does not give the text of 'odd.txt' back as it "
                             "is: from byte 9, '日本 the lamp\\n"),
            std::string::npos)
      << warnings[0];
}
