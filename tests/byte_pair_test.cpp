// lamp::data::BytePairEncoding (GPT-2's kind of tokenizer) and
// lamp::data::Tokenizer: the ids Python's tokenizers give, from every file
// format, for texts that exercise GPT-2's split; any bytes back; damaged
// files refused by name. The files are tests/python/byte_pair/, written by
// tests/python/make_byte_pair_files.py (Hugging Face's tokenizers and
// tiktoken), so that these tests need no Python.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/byte_pair_split.h"
#include "test_util.h"

namespace {

using lamp_test::error_of;

const std::string kFiles = LAMP_SOURCE_DIR "/tests/python/byte_pair";

std::string file(const std::string& name) {
  return kFiles + "/" + name;
}

struct Case {
  std::string text;
  std::vector<int64_t> ids;
};

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(
        static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

// expected.txt: "text HEX" and "ids N N ..." lines, a pair per text.
std::vector<Case> expected_cases(
    const std::string& path = file("expected.txt")) {
  std::ifstream in(path);
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("text", 0) == 0) {
      Case c;
      c.text = from_hex(line.size() > 5 ? line.substr(5) : "");
      cases.push_back(c);
    } else if (line.rfind("ids", 0) == 0 && !cases.empty()) {
      std::istringstream ids(line.substr(3));
      int64_t id = 0;
      while (ids >> id) {
        cases.back().ids.push_back(id);
      }
    }
  }
  return cases;
}

std::vector<int64_t> as_vector(const torch::Tensor& ids) {
  EXPECT_EQ(ids.scalar_type(), torch::kLong);
  EXPECT_EQ(ids.dim(), 1);
  return std::vector<int64_t>(ids.data_ptr<int64_t>(),
                              ids.data_ptr<int64_t>() + ids.numel());
}

torch::Tensor ids_of(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::kLong);
}

// Each way to name the same tokenizer.
std::vector<std::string> every_format() {
  return {file("tokenizer.json"), file("vocab.json"), file("tokens.tiktoken"),
          kFiles};
}

// lamp built with ICU where the build found it (CMake's LAMP_WITH_ICU):
// then encoding must work, never skip.
bool can_encode() {
  EXPECT_EQ(lamp::data::byte_pair_encode_available(),
            static_cast<bool>(LAMP_TEST_EXPECT_ICU));
  return lamp::data::byte_pair_encode_available();
}

// A scratch folder of the running test.
class Scratch : public lamp_test::ScratchFolder {
 public:
  explicit Scratch(const std::string& name) : ScratchFolder("lamp_bpe", name) {}
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

std::vector<std::string> pieces(
    const std::string& text,
    lamp::data::BytePairSplit split = lamp::data::BytePairSplit::kGpt2) {
  std::vector<std::string> out;
  lamp::data::detail::byte_pair_split(
      text, split, [&](size_t begin, size_t end) {
        out.push_back(text.substr(begin, end - begin));
      });
  return out;
}

// The pieces are the matches of GPT-2's pattern as Python's regex module
// finds them (tiktoken's r50k pattern, checked with regex 2024 on Python
// 3.11): contractions, a space leading a run of one kind, runs of white
// space giving their last character to the next piece, Unicode's spaces
// (U+00A0, U+3000, U+0085, U+2028) and digits.
TEST(Gpt2Split, PiecesAreThePatternsMatches) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces("It's  a test,\n\n  x"),
            (Pieces{"It", "'s", " ", " a", " test", ",", "\n\n ", " x"}));
  EXPECT_EQ(
      pieces("don't 42nd\u00a0\u3000word  "),
      (Pieces{"don", "'t", " 42", "nd", "\u00a0", "\u3000", "word", "  "}));
  EXPECT_EQ(pieces("a\u0085b \u2028c"),
            (Pieces{"a", "\u0085", "b", " ", "\u2028", "c"}));
  EXPECT_EQ(pieces("x86_64 -> ok!!  "),
            (Pieces{"x", "86", "_", "64", " ->", " ok", "!!", "  "}));
  EXPECT_EQ(pieces("   "), (Pieces{"   "}));
  EXPECT_EQ(pieces(""), (Pieces{}));
  // A byte that begins no UTF-8 character is one of its own, of the third
  // kind ([^\s\p{L}\p{N}]): apart from the letters beside it, with the
  // punctuation after it, led by a space.
  EXPECT_EQ(pieces("ab\xFF"
                   "cd"),
            (Pieces{"ab", "\xFF", "cd"}));
  EXPECT_EQ(pieces("a \xFF!b"), (Pieces{"a", " \xFF!", "b"}));
  EXPECT_EQ(pieces("\xC3"
                   "a\xE6\x97"),
            (Pieces{"\xC3", "a", "\xE6\x97"}));
}

struct SplitCase {
  std::string split;
  std::string text;
  std::vector<std::string> pieces;
};

// splits.txt: "split NAME", then "text HEX" and "pieces HEX HEX ..." lines.
std::vector<SplitCase> split_cases() {
  std::ifstream in(file("splits.txt"));
  std::vector<SplitCase> cases;
  std::string line;
  std::string split;
  while (std::getline(in, line)) {
    if (line.rfind("split ", 0) == 0) {
      split = line.substr(6);
    } else if (line.rfind("text", 0) == 0) {
      cases.push_back(
          {split, from_hex(line.size() > 5 ? line.substr(5) : ""), {}});
    } else if (line.rfind("pieces", 0) == 0 && !cases.empty()) {
      std::istringstream hex(line.substr(6));
      std::string piece;
      while (hex >> piece) {
        cases.back().pieces.push_back(from_hex(piece));
      }
    }
  }
  return cases;
}

lamp::data::BytePairSplit split_named(const std::string& name) {
  using lamp::data::BytePairSplit;
  if (name == "cl100k") {
    return BytePairSplit::kCl100k;
  }
  if (name == "llama3") {
    return BytePairSplit::kLlama3;
  }
  return name == "o200k" ? BytePairSplit::kO200k : BytePairSplit::kGpt2;
}

// Every split's pieces of every text are its pattern's matches as Python's
// regex module finds them (which, merged one by one, give tiktoken's ids:
// the script that wrote them checked it).
TEST(BytePairSplit, PiecesAreThePatternsMatches) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  const auto cases = split_cases();
  ASSERT_EQ(cases.size(), 4u * 34u) << "splits.txt was not read";
  for (const auto& c : cases) {
    SCOPED_TRACE(c.split + ": " + c.text);
    EXPECT_EQ(pieces(c.text, split_named(c.split)), c.pieces);
  }
}

// Where the splits differ, by hand: cl100k_base's white space ending the
// text is one piece, Llama 3's is cut after its last line break; o200k_base
// cuts CamelCase and keeps contractions with their word; a byte that
// begins no character may lead letters, as punctuation does.
TEST(BytePairSplit, TheSplitsDifferWhereTheirPatternsDo) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  using lamp::data::BytePairSplit;
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces("ab\n  ", BytePairSplit::kCl100k), (Pieces{"ab", "\n  "}));
  EXPECT_EQ(pieces("ab\n  ", BytePairSplit::kLlama3),
            (Pieces{"ab", "\n", "  "}));
  EXPECT_EQ(pieces("ab\n  ", BytePairSplit::kO200k),
            (Pieces{"ab", "\n", "  "}));
  EXPECT_EQ(pieces("ab\n  ", BytePairSplit::kGpt2), (Pieces{"ab", "\n  "}));
  EXPECT_EQ(pieces("CamelCase it's 12345", BytePairSplit::kO200k),
            (Pieces{"Camel", "Case", " it's", " ", "123", "45"}));
  // Upper, then a letter of both classes (U+3005), then upper: the first
  // alternative gives back the upper letters after the last of both.
  EXPECT_EQ(pieces("A\u3005B x", BytePairSplit::kO200k),
            (Pieces{"A\u3005", "B", " x"}));
  EXPECT_EQ(pieces("CamelCase it's 12345", BytePairSplit::kCl100k),
            (Pieces{"CamelCase", " it", "'s", " ", "123", "45"}));
  EXPECT_EQ(pieces("CamelCase it's 12345", BytePairSplit::kGpt2),
            (Pieces{"CamelCase", " it", "'s", " 12345"}));
  EXPECT_EQ(pieces("ab\xFF"
                   "cd",
                   BytePairSplit::kCl100k),
            (Pieces{"ab",
                    "\xFF"
                    "cd"}));
  EXPECT_EQ(pieces("ab\xFF"
                   "cd",
                   BytePairSplit::kO200k),
            (Pieces{"ab",
                    "\xFF"
                    "cd"}));
  EXPECT_EQ(pieces("\xC3\n\xE6\x97", BytePairSplit::kO200k),
            (Pieces{"\xC3\n", "\xE6\x97"}));
}

// Lines of what the splits treat apart around line breaks: CJK letters and
// punctuation, digits, marks, emoji, slashes, contractions, Unicode's white
// space (U+00A0, U+3000, U+0085, U+2028) before and after breaks, CRLF,
// runs of breaks and spaces, and bytes that begin no character.
std::string lines_around_breaks(int lines, uint32_t seed) {
  static const char* starts[] = {
      "\xe4\xb8\xad\xe6\x96\x87", // 中文
      "\xe3\x80\x8c",             // 「
      "\xe3\x83\xbb",             // ・ (Katakana's middle dot, punctuation)
      "\xcc\x81"
      "a", // a combining mark, then a letter
      "12",
      "1234",
      "-",
      "* item",
      "/x",
      "//",
      "'s",
      "'ll",
      "Word",
      "word",
      "\xf0\x9f\x98\x80",
      " x",
      "  y",
      "\t",
      "\xc2\xa0"
      "a",
      "\xe3\x80\x80"
      "b",
      "\xc2\x85"
      "c",
      "\xe2\x80\xa8"
      "d",
      "\xff"
      "e",
      "\xe6\x97",
      "(",
      "\"q\"",
      "\r",
      "\n"};
  static const char* ends[] = {"\xe3\x80\x82", // 。
                               "\xe6\x96\x87", // 文
                               ".",
                               "!",
                               "a",
                               "Z",
                               "9",
                               "\xcc\x81",
                               "/",
                               "\xf0\x9f\x98\x80",
                               " ",
                               "  ",
                               "\xc2\xa0",
                               "\xe3\x80\x80",
                               "\xc2\x85",
                               "\xe2\x80\xa8",
                               "\r",
                               "\xff",
                               "\xe6\x97",
                               "\xe3\x80\x80\x80",
                               "'s"};
  static const char* breaks[] = {"\n", "\n", "\n", "\r\n", "\n\n", "\n \n"};
  std::mt19937 random(seed);
  const auto pick = [&random](size_t n) {
    return static_cast<size_t>(random() % static_cast<uint32_t>(n));
  };
  std::string text;
  for (int line = 0; line < lines; ++line) {
    text += starts[pick(sizeof(starts) / sizeof(starts[0]))];
    text += pick(3) == 0 ? " and more" : "";
    text += ends[pick(sizeof(ends) / sizeof(ends[0]))];
    text += breaks[pick(sizeof(breaks) / sizeof(breaks[0]))];
  }
  return text;
}

// Where byte_pair_cut_is_safe() says a text may be cut, every split gives
// the whole text's pieces from the two parts: the pieces before the cut
// from the first, those after from the second. The places it refuses are
// needed: each is shown breaking a split.
TEST(BytePairSplit, ASafeCutGivesTheWholeTextsPieces) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  using lamp::data::BytePairSplit;
  using lamp::data::detail::byte_pair_cut_is_safe;
  using Pieces = std::vector<std::string>;
  const auto text = lines_around_breaks(600, 5);
  size_t cuts = 0;
  size_t breaks_refused = 0;
  size_t before_space = 0;  // cuts "word| word"
  size_t before_return = 0; // cuts "word|\r\n"
  for (size_t i = 0; i <= text.size(); ++i) {
    if (!byte_pair_cut_is_safe(text, i)) {
      breaks_refused += i > 0 && i < text.size() && text[i - 1] == '\n';
      continue;
    }
    ++cuts;
    before_space += text[i] == ' ';
    before_return += text[i] == '\r';
    for (const auto split : {BytePairSplit::kGpt2, BytePairSplit::kCl100k,
                             BytePairSplit::kLlama3, BytePairSplit::kO200k}) {
      Pieces whole_before, whole_after;
      size_t at = 0;
      for (const auto& piece : pieces(text, split)) {
        (at < i ? whole_before : whole_after).push_back(piece);
        at += piece.size();
        ASSERT_TRUE(at <= i || at - piece.size() >= i)
            << "a piece of the whole text crosses the cut at byte " << i
            << " (split " << lamp::data::byte_pair_split_name(split) << ")";
      }
      EXPECT_EQ(pieces(text.substr(0, i), split), whole_before)
          << "the cut at byte " << i << ", split "
          << lamp::data::byte_pair_split_name(split);
      EXPECT_EQ(pieces(text.substr(i), split), whole_after)
          << "the cut at byte " << i << ", split "
          << lamp::data::byte_pair_split_name(split);
    }
  }
  // 125 of the 790 breaks can be cut after (seed 5): the lines mostly end
  // or start with white space, or are runs of breaks, to try the refusals.
  // And before the space of " and more", and "\r" after a letter or digit.
  EXPECT_GT(cuts - before_space - before_return, 100u) << breaks_refused;
  EXPECT_GT(breaks_refused, 500u) << cuts;
  EXPECT_GT(before_space, 100u);
  EXPECT_GT(before_return, 10u);

  // Lines that start with CJK letters or punctuation, digits, marks, list
  // items: cut. After white space, CRLF, and before white space or a
  // slash: not.
  EXPECT_TRUE(byte_pair_cut_is_safe("\xe6\x96\x87\n\xe4\xb8\xad", 4));
  EXPECT_TRUE(byte_pair_cut_is_safe("\xe3\x80\x82\n\xe3\x80\x8c", 4));
  EXPECT_TRUE(byte_pair_cut_is_safe("a\n12", 2));
  EXPECT_TRUE(byte_pair_cut_is_safe("a\n- item", 2));
  EXPECT_TRUE(byte_pair_cut_is_safe("a\xcc\x81\n\xcc\x81", 4));
  EXPECT_TRUE(byte_pair_cut_is_safe("\xff\n\xff", 2));
  EXPECT_TRUE(byte_pair_cut_is_safe("\xe3\x80\x80\x80\nb", 5)); // a stray byte
  EXPECT_FALSE(byte_pair_cut_is_safe("a\r\nb", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("a \nb", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("a\xe3\x80\x80\nb", 5));
  EXPECT_FALSE(byte_pair_cut_is_safe("a\xc2\x85\nb", 4));
  EXPECT_FALSE(byte_pair_cut_is_safe("a\n b", 2));
  EXPECT_FALSE(
      byte_pair_cut_is_safe("a\n\xe3\x80\x80"
                            "b",
                            2));
  EXPECT_FALSE(byte_pair_cut_is_safe("a!\n/b", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("a\nb", 0));
  EXPECT_FALSE(byte_pair_cut_is_safe("a\n", 2));
  // Between words, and before a CRLF after a letter or digit: cut. Not
  // where either side of the space is no letter, nor before a CRLF after
  // punctuation.
  EXPECT_TRUE(byte_pair_cut_is_safe("one two", 3));
  EXPECT_TRUE(byte_pair_cut_is_safe("\xe6\x96\x87 \xe4\xb8\xad", 3));
  EXPECT_TRUE(byte_pair_cut_is_safe("a\r\nb", 1));
  EXPECT_TRUE(byte_pair_cut_is_safe("a12\r\n", 3));
  EXPECT_TRUE(byte_pair_cut_is_safe("a\r", 1));
  EXPECT_FALSE(byte_pair_cut_is_safe("one ", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("one  two", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("one 2", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("one. two", 4));
  EXPECT_FALSE(byte_pair_cut_is_safe("\xe3\x80\x80 two", 3));
  EXPECT_FALSE(byte_pair_cut_is_safe("a\x80 b", 2)); // a stray byte
  EXPECT_FALSE(byte_pair_cut_is_safe("a.\r\nb", 2));
  EXPECT_FALSE(byte_pair_cut_is_safe("a \r\nb", 2));
  EXPECT_FALSE(byte_pair_cut_is_safe("\r\nb", 0));
  // Past 2 GiB, where ICU's int32_t indexes end: a text mapped but not
  // filled (its pages never touched, but for the last), with white space
  // of three bytes (U+3000) after the break and before it.
  {
    const size_t far = (size_t{1} << 31) + 100;
    const size_t size = far + 4096;
    void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    auto* bytes = static_cast<char*>(mapped);
    const std::string after = "a\n\xe3\x80\x80"; // the cut before U+3000
    std::memcpy(bytes + far - 2, after.data(), after.size());
    EXPECT_FALSE(byte_pair_cut_is_safe(std::string_view(bytes, far + 3), far));
    const std::string before = "\xe3\x80\x80\nb"; // U+3000 before the break
    std::memcpy(bytes + far - 4, before.data(), before.size());
    EXPECT_FALSE(byte_pair_cut_is_safe(std::string_view(bytes, far + 1), far));
    bytes[far - 4] = 'a'; // "a\x80\x80\nb": stray bytes before the break
    EXPECT_TRUE(byte_pair_cut_is_safe(std::string_view(bytes, far + 1), far));
    ::munmap(mapped, size);
  }
  // Why: o200k_base's punctuation takes the slash after a break; GPT-2's
  // white space before a break ends with it only at the text's end; CRLF
  // likewise.
  EXPECT_EQ(pieces("!\n/b", BytePairSplit::kO200k), (Pieces{"!\n/", "b"}));
  EXPECT_EQ(pieces("a\xe3\x80\x80\nb", BytePairSplit::kGpt2),
            (Pieces{"a", "\xe3\x80\x80", "\n", "b"}));
  EXPECT_EQ(pieces("a\xe3\x80\x80\n", BytePairSplit::kGpt2),
            (Pieces{"a", "\xe3\x80\x80\n"}));
  EXPECT_EQ(pieces("a\r\nb", BytePairSplit::kGpt2),
            (Pieces{"a", "\r", "\n", "b"}));
  EXPECT_EQ(pieces("a\r\n", BytePairSplit::kGpt2), (Pieces{"a", "\r\n"}));
  // Punctuation takes the CRLF after it.
  EXPECT_EQ(pieces("a.\r\nb", BytePairSplit::kCl100k),
            (Pieces{"a", ".\r\n", "b"}));
}

// The other splits' tokenizers give Python's ids: cl100k_base's pattern
// from a tiktoken file (tiktoken's ids), Llama 3's from Hugging Face's
// tokenizer.json (which names it) and from the same tokens in tiktoken's
// form, o200k_base's from both.
TEST(BytePairEncoding, OtherSplitsEncodeAsPython) {
  using lamp::data::BytePairEncoding;
  using lamp::data::BytePairSplit;
  struct Check {
    std::string path;
    BytePairSplit asked;
    BytePairSplit split;
    std::string expected;
  };
  const Check checks[] = {
      {"cl100k/tokens.tiktoken", BytePairSplit::kCl100k, BytePairSplit::kCl100k,
       "cl100k/expected.txt"},
      {"cl100k/tokens.tiktoken", BytePairSplit::kLlama3, BytePairSplit::kLlama3,
       "cl100k/expected_llama3.txt"},
      {"cl100k/tokenizer.json", BytePairSplit::kAuto, BytePairSplit::kLlama3,
       "cl100k/expected_llama3.txt"},
      {"cl100k", BytePairSplit::kLlama3, BytePairSplit::kLlama3,
       "cl100k/expected_llama3.txt"},
      {"o200k/tokenizer.json", BytePairSplit::kAuto, BytePairSplit::kO200k,
       "o200k/expected.txt"},
      {"o200k/tokens.tiktoken", BytePairSplit::kO200k, BytePairSplit::kO200k,
       "o200k/expected.txt"},
  };
  for (const auto& check : checks) {
    SCOPED_TRACE(check.path + " as " +
                 lamp::data::byte_pair_split_name(check.asked));
    const auto bpe = BytePairEncoding::load(file(check.path), check.asked);
    EXPECT_EQ(bpe.split(), check.split);
    EXPECT_EQ(bpe.vocab_size(), 600);
    EXPECT_EQ(bpe.describe(),
              "byte-level BPE (" +
                  lamp::data::byte_pair_split_name(check.split) +
                  " split), 600 ids");
    const auto cases = expected_cases(file(check.expected));
    ASSERT_EQ(cases.size(), 34u);
    for (const auto& c : cases) {
      SCOPED_TRACE(c.text);
      EXPECT_EQ(bpe.decode(ids_of(c.ids)), c.text);
      if (can_encode()) {
        EXPECT_EQ(as_vector(bpe.encode(c.text)), c.ids);
      }
    }
  }
  // A tiktoken file names no split: GPT-2's, unless asked.
  EXPECT_EQ(BytePairEncoding::load(file("o200k/tokens.tiktoken")).split(),
            BytePairSplit::kGpt2);
  // A tokenizer.json names its own, and another asked for is refused.
  const auto message = error_of([&] {
    BytePairEncoding::load(file("o200k/tokenizer.json"),
                           BytePairSplit::kCl100k);
  });
  EXPECT_NE(message.find("splits the text as o200k_base's pattern, not as "
                         "cl100k_base's, which was asked for"),
            std::string::npos)
      << message;
}

// Hugging Face's ignore_merges (Llama 3's files set it): a piece that is a
// token whole is that token, even where the merges never make it. The ids
// are those Hugging Face's tokenizers 0.23.3 gives for the same file.
TEST(BytePairEncoding, FollowsIgnoreMerges) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  Scratch scratch("ignore");
  auto text = read(file("cl100k/tokenizer.json"));
  const std::string vocab = "\"vocab\": {";
  ASSERT_NE(text.find(vocab), std::string::npos);
  // " xyzzy" (its space as GPT-2's byte map writes it, U+0120): no merge
  // makes it.
  text.insert(text.find(vocab) + vocab.size(), "\"\u0120xyzzy\": 600, ");
  const std::string ignore = "\"ignore_merges\": false";
  ASSERT_NE(text.find(ignore), std::string::npos);
  const auto merged =
      lamp::data::BytePairEncoding::load(scratch.write("merged.json", text));
  EXPECT_EQ(as_vector(merged.encode(" xyzzy and xyzzy")),
            (std::vector<int64_t>{220, 87, 88, 89, 89, 88, 284, 220, 87, 88, 89,
                                  89, 88}));
  text.replace(text.find(ignore), ignore.size(), "\"ignore_merges\": true");
  const auto whole =
      lamp::data::BytePairEncoding::load(scratch.write("whole.json", text));
  EXPECT_EQ(as_vector(whole.encode(" xyzzy and xyzzy")),
            (std::vector<int64_t>{600, 284, 600}));
}

std::string base64(const std::string& bytes) {
  static const char* digits =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t bits = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) {
      bits |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8;
    }
    if (i + 2 < bytes.size()) {
      bits |= static_cast<uint8_t>(bytes[i + 2]);
    }
    out += digits[(bits >> 18) & 63];
    out += digits[(bits >> 12) & 63];
    out += i + 1 < bytes.size() ? digits[(bits >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? digits[bits & 63] : '=';
  }
  return out;
}

// tiktoken's files of cl100k_base and o200k_base are known by their number
// of tokens, and take tiktoken's split and special tokens; one token more
// or fewer is no longer either (GPT-2's split, <|endoftext|> after the
// last).
TEST(BytePairEncoding, KnowsTiktokensEncodingsByTheirSize) {
  using lamp::data::BytePairSplit;
  Scratch scratch("sizes");
  const auto tiktoken_of = [&](const std::string& name, int64_t count) {
    std::string text;
    for (int64_t id = 0; id < count; ++id) {
      const std::string bytes = id < 256 ? std::string(1, static_cast<char>(id))
                                         : "t" + std::to_string(id);
      text += base64(bytes) + " " + std::to_string(id) + "\n";
    }
    return lamp::data::BytePairEncoding::load(scratch.write(name, text));
  };
  const auto cl100k = tiktoken_of("cl100k.tiktoken", 100256);
  EXPECT_EQ(cl100k.split(), BytePairSplit::kCl100k);
  EXPECT_EQ(cl100k.vocab_size(), 100277);
  EXPECT_EQ(cl100k.describe(),
            "byte-level BPE (cl100k_base's split), "
            "100277 ids");
  EXPECT_EQ(cl100k.decode(ids_of(
                {100255, 100256, 100257, 100258, 100260, 100261, 100276})),
            "t100255<100256><|endoftext|><|fim_prefix|><|fim_suffix|>"
            "<100261><|endofprompt|>");
  const auto o200k = tiktoken_of("o200k.tiktoken", 199998);
  EXPECT_EQ(o200k.split(), BytePairSplit::kO200k);
  EXPECT_EQ(o200k.vocab_size(), 200019);
  EXPECT_EQ(o200k.decode(ids_of({199999, 200000, 200018})),
            "<|endoftext|><200000><|endofprompt|>");
  const auto other = tiktoken_of("other.tiktoken", 100257);
  EXPECT_EQ(other.split(), BytePairSplit::kGpt2);
  EXPECT_EQ(other.vocab_size(), 100258);
  EXPECT_EQ(other.decode(ids_of({100257})), "<|endoftext|>");
  // Asked for, a split is taken whatever the size.
  EXPECT_EQ(lamp::data::BytePairEncoding::load(
                scratch.dir() + "/cl100k.tiktoken", BytePairSplit::kGpt2)
                .split(),
            BytePairSplit::kGpt2);
}

TEST(BytePairEncoding, EveryFormatEncodesAsPython) {
  const auto cases = expected_cases();
  ASSERT_EQ(cases.size(), 22u) << "expected.txt was not read";
  for (const auto& path : every_format()) {
    SCOPED_TRACE(path);
    const auto bpe = lamp::data::BytePairEncoding::load(path);
    EXPECT_EQ(bpe.vocab_size(), 600);
    for (const auto& c : cases) {
      SCOPED_TRACE(c.text);
      EXPECT_EQ(bpe.decode(ids_of(c.ids)), c.text);
      if (can_encode()) {
        EXPECT_EQ(as_vector(bpe.encode(c.text)), c.ids);
      }
    }
  }
}

// Pieces of thousands of bytes, each merged through a heap (a run of one
// letter, a word made of 600 words, digits, punctuation, spaces before a
// word): Python's ids, from tiktoken's ranks and Hugging Face's merges, on
// their own, in a longer text, and from a cache.
TEST(BytePairEncoding, MergesLongPiecesAsPython) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  const auto cases = expected_cases(file("expected_long.txt"));
  ASSERT_EQ(cases.size(), 5u) << "expected_long.txt was not read";
  // The texts one after another, a line each, the spaces first (a line
  // break before them would join their piece).
  std::string all;
  std::vector<int64_t> all_ids;
  for (const size_t i : std::vector<size_t>{4, 0, 1, 2, 3}) {
    const auto& c = cases[i];
    // Longer than any piece merged by scanning (128 bytes) by far.
    EXPECT_GT(pieces(c.text).front().size(), 1500u) << c.text.substr(0, 20);
    if (!all.empty()) {
      all += "\n";
      all_ids.push_back(-1); // the "\n"'s id, filled below
    }
    all += c.text;
    all_ids.insert(all_ids.end(), c.ids.begin(), c.ids.end());
  }
  for (const auto& path : every_format()) {
    SCOPED_TRACE(path);
    const auto bpe = lamp::data::BytePairEncoding::load(path);
    lamp::data::BytePairCache cache;
    for (const auto& c : cases) {
      SCOPED_TRACE(c.text.substr(0, 20));
      EXPECT_EQ(as_vector(bpe.encode(c.text)), c.ids);
      EXPECT_EQ(as_vector(bpe.encode(c.text, cache)), c.ids);
    }
    auto expected = all_ids;
    const auto newline = as_vector(bpe.encode("\n"));
    ASSERT_EQ(newline.size(), 1u);
    std::replace(expected.begin(), expected.end(), int64_t{-1}, newline[0]);
    EXPECT_EQ(as_vector(bpe.encode(all)), expected);
  }
}

// A cache holds each piece of more than one byte once, across texts (its
// keys outlive the texts they came from), gives the ids encode() gives,
// is shared by copies of a tokenizer, and starts afresh with another.
TEST(BytePairCache, KeepsPiecesAcrossTextsAndFollowsItsTokenizer) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  const auto gpt2 = lamp::data::BytePairEncoding::load(file("tokenizer.json"));
  lamp::data::BytePairCache cache;
  EXPECT_EQ(cache.size(), 0);
  const auto encoded = [&](const lamp::data::BytePairEncoding& bpe,
                           const std::string& text) {
    // A text that is gone once encoded: the cache keeps copies.
    auto ids = as_vector(bpe.encode(std::string(text), cache));
    EXPECT_EQ(ids, as_vector(bpe.encode(text))) << text;
    return ids;
  };
  encoded(gpt2, "hello world hello");
  EXPECT_EQ(cache.size(), 3); // "hello", " world", " hello"
  const auto again = encoded(gpt2, " world again, hello world hello");
  EXPECT_EQ(cache.size(), 4); // and " again"; "," (one byte) not held
  EXPECT_EQ(again, encoded(gpt2, " world again, hello world hello"));
  const auto copy = gpt2; // the same model: the same pieces
  encoded(copy, "hello again");
  EXPECT_EQ(cache.size(), 4);
  const auto other =
      lamp::data::BytePairEncoding::load(file("cl100k/tokenizer.json"));
  encoded(other, "hello world");
  EXPECT_EQ(cache.size(), 2); // afresh: "hello", " world"
  encoded(gpt2, "hello");
  EXPECT_EQ(cache.size(), 1);
}

TEST(BytePairEncoding, FormatsAgreeOnTheVocabulary) {
  const auto json = lamp::data::BytePairEncoding::load(file("tokenizer.json"));
  const auto pair = lamp::data::BytePairEncoding::load(file("vocab.json"));
  const auto tiktoken =
      lamp::data::BytePairEncoding::load(file("tokens.tiktoken"));
  EXPECT_EQ(json.vocabulary_bytes(), pair.vocabulary_bytes());
  EXPECT_EQ(json.vocabulary_bytes(), tiktoken.vocabulary_bytes());
  EXPECT_EQ(json.describe(), "byte-level BPE (GPT-2's split), 600 ids");
  EXPECT_EQ(tiktoken.describe(), json.describe());
  EXPECT_EQ(pair.origin(), file("vocab.json") + " with " + file("merges.txt"));
  EXPECT_EQ(lamp::data::BytePairEncoding::load(kFiles).origin(),
            file("tokenizer.json"));
  // The special token follows tiktoken's tokens, as GPT-2's 50256 does.
  EXPECT_EQ(tiktoken.decode(ids_of({599})), "<|endoftext|>");
  EXPECT_EQ(json.decode(ids_of({599})), "<|endoftext|>");
  // Another vocabulary differs: one token's bytes changed.
  // Another vocabulary of as many ids differs: the last token's bytes
  // changed to "zzzz".
  Scratch scratch("vocab");
  const auto text = read(file("tokens.tiktoken"));
  const size_t last = text.rfind('\n', text.size() - 2);
  const auto other = lamp::data::BytePairEncoding::load(scratch.write(
      "other.tiktoken", text.substr(0, last + 1) + "enp6eg== 598\n"));
  EXPECT_EQ(other.vocab_size(), tiktoken.vocab_size());
  EXPECT_NE(other.vocabulary_bytes(), tiktoken.vocabulary_bytes());
  // A file that leaves an id out (p50k_base's 50256) gives it to
  // <|endoftext|>.
  const size_t line_300 = text.find("\n", text.find(" 299\n")) + 1;
  const auto gapped = lamp::data::BytePairEncoding::load(scratch.write(
      "gap.tiktoken",
      text.substr(0, line_300) + text.substr(text.find('\n', line_300) + 1)));
  EXPECT_EQ(gapped.vocab_size(), 599);
  EXPECT_EQ(gapped.decode(ids_of({300, 598})),
            "<|endoftext|>" + tiktoken.decode(ids_of({598})));
}

TEST(BytePairEncoding, AnyBytesComeBack) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  const auto bpe = lamp::data::BytePairEncoding::load(file("tokens.tiktoken"));
  std::mt19937 random(7);
  // Random bytes (mostly not UTF-8), then text-like runs of the pattern's
  // kinds with stray continuation and lead bytes among them.
  for (int trial = 0; trial < 50; ++trial) {
    std::string text;
    const int length = static_cast<int>(random() % 300);
    for (int i = 0; i < length; ++i) {
      text.push_back(static_cast<char>(random() % 256));
    }
    EXPECT_EQ(bpe.decode(bpe.encode(text)), text) << "trial " << trial;
  }
  const std::string parts[] = {
      " ",     "  ",          "\n",   "\t",       "word",
      " word", "12",          "'s",   "'ll",      "!!",
      "é",     "\x80",        "\xC3", "\xE6\x97", "\xF0\x9F\x99\x82",
      "\xA0",  "\xE3\x80\x80"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int count = static_cast<int>(random() % 12);
    for (int i = 0; i < count; ++i) {
      text += parts[random() % (sizeof(parts) / sizeof(parts[0]))];
    }
    EXPECT_EQ(bpe.decode(bpe.encode(text)), text) << "trial " << trial;
  }
  // A byte that begins no character is its own, beside text.
  EXPECT_EQ(bpe.decode(bpe.encode("a\xFF"
                                  "b")),
            "a\xFF"
            "b");
  EXPECT_EQ(bpe.encode("").numel(), 0);
}

TEST(BytePairEncoding, DecodesIdsWithoutATokenAsTheirNumber) {
  const auto bpe = lamp::data::BytePairEncoding::load(file("tokenizer.json"));
  EXPECT_EQ(bpe.decode(ids_of({-1, 600, 123456789})), "<-1><600><123456789>");
  // Any integer type, any shape [n].
  EXPECT_EQ(bpe.decode(ids_of({72}).to(torch::kShort)),
            bpe.decode(ids_of({72})));
  EXPECT_NE(error_of([&] {
              bpe.decode(torch::ones({2}, torch::kFloat));
            }).find("ids must be integers [n], got Float"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              bpe.decode(torch::ones({2, 2}, torch::kLong));
            }).find("ids must be integers [n]"),
            std::string::npos);
  const lamp::data::BytePairEncoding empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_NE(
      error_of([&] { empty.vocab_size(); }).find("no tokenizer was loaded"),
      std::string::npos);
}

// Each damaged or foreign file is refused, naming the file, what is wrong
// and the fix.
TEST(BytePairEncoding, RefusesDamagedAndForeignFiles) {
  Scratch scratch("files");
  const auto refusal = [&](const std::string& path) {
    return error_of([&] { lamp::data::BytePairEncoding::load(path); });
  };
  const auto expect_refused = [&](const std::string& path,
                                  const std::string& why) {
    const auto message = refusal(path);
    EXPECT_NE(message.find(why), std::string::npos) << message;
  };
  expect_refused(scratch.dir() + "/missing.tiktoken", "missing.tiktoken");
  expect_refused(scratch.write("empty.tiktoken", ""),
                 "is no tokenizer lamp reads as a byte-level BPE");
  expect_refused(scratch.write("merges.txt", "#version: 0.2\nh e\n"),
                 "it looks like a merges file: give the vocab.json beside it");
  const auto tiktoken = read(file("tokens.tiktoken"));
  expect_refused(scratch.write("bad64.tiktoken", tiktoken + "Q!== 700\n"),
                 "line 600 of '" + scratch.dir() +
                     "/bad64.tiktoken' ('Q!== 700') is not base64");
  expect_refused(scratch.write("noid.tiktoken", tiktoken + "QUJD x\n"),
                 "has no id (a whole number) after its space");
  expect_refused(scratch.write("twice.tiktoken", tiktoken + "QUJD 3\n"),
                 "has the id 3, which another token has already");
  expect_refused(scratch.write("same.tiktoken", tiktoken + "IQ== 700\n"),
                 "holds one token as both id 0 and id 700");
  // An id far beyond the others is refused, not a table of 2^30 tokens
  // (34 GB) made for it.
  expect_refused(scratch.write("far.tiktoken", tiktoken + "QUJD 1073741823\n"),
                 "/far.tiktoken' holds 600 tokens but one has the id "
                 "1073741823: a byte-level BPE's ids are its tokens' ranks, "
                 "0 ... 599 with few gaps; the file is damaged");
  // Without the byte 0x21 ("!", the file's first line).
  expect_refused(scratch.write("nobyte.tiktoken",
                               tiktoken.substr(tiktoken.find('\n') + 1)),
                 "has no token for the byte 0x21: it is not a byte-level BPE");

  // Hugging Face's pair: the merges beside the vocabulary, of its tokens.
  const auto vocab = read(file("vocab.json"));
  const auto merges = read(file("merges.txt"));
  Scratch alone("alone");
  expect_refused(alone.write("vocab.json", vocab),
                 "is a vocabulary without its merges: neither");
  alone.write("merges.txt", merges + "Ġzz qq\n");
  expect_refused(alone.dir() + "/vocab.json",
                 "merges 'Ġzz' and 'qq', but the vocabulary lacks 'Ġzz'");
  alone.write("merges.txt", merges + "one two three\n");
  expect_refused(alone.dir() + "/vocab.json",
                 "is not a merge, two tokens with a space between");
  Scratch gpt2("gpt2");
  gpt2.write("encoder.json", vocab);
  gpt2.write("vocab.bpe", merges);
  EXPECT_EQ(lamp::data::BytePairEncoding::load(gpt2.dir()).vocabulary_bytes(),
            lamp::data::BytePairEncoding::load(file("vocab.json"))
                .vocabulary_bytes());
  Scratch far("far");
  far.write("merges.txt", merges);
  far.write("vocab.json",
            "{\"Ġzzz\": 1073741823, " + vocab.substr(vocab.find('{') + 1));
  expect_refused(far.dir() + "/vocab.json",
                 "tokens but one has the id 1073741823");
  expect_refused(alone.write("spm.json", "{\"▁the\": 5}"),
                 "is not spelled in GPT-2's byte map");
  expect_refused(scratch.dir(), "none of a tokenizer's files");

  // tokenizer.json: GPT-2's kind only.
  const auto json = read(file("tokenizer.json"));
  expect_refused(scratch.write("cut.json", json.substr(0, json.size() / 2)),
                 "is not valid JSON (at byte");
  const auto with = [&](const std::string& from, const std::string& to) {
    auto changed = json;
    const auto at = changed.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return changed.replace(at, from.size(), to);
  };
  // An added token's id far beyond the tokens' too: a vocabulary of 2^30
  // ids (a 2 GiB vocabulary_bytes()) was made for it.
  expect_refused(
      scratch.write("far_added.json",
                    with("\"added_tokens\": [",
                         "\"added_tokens\": [{\"id\": 1073741823, "
                         "\"content\": \"<|x|>\"}, ")),
      "'s added token '<|x|>' has the id 1073741823, outside 0 ... 2221 (its "
      "599 tokens' ids with few gaps) or another's; the file is damaged");
  expect_refused(scratch.write("unigram.json", with("\"type\": \"BPE\"",
                                                    "\"type\": \"Unigram\"")),
                 "is a tokenizer of the kind 'Unigram', not a BPE");
  expect_refused(
      scratch.write("split.json",
                    with("\"pre_tokenizer\": {\n    \"type\": \"ByteLevel\"",
                         "\"pre_tokenizer\": {\"type\": \"Sequence\"")),
      "splits the text otherwise than lamp can (its pre-tokenizer is "
      "'Sequence')");
  // A Split by a pattern lamp does not know (Qwen 2's: single digits) is
  // named.
  const auto llama3 = read(file("cl100k/tokenizer.json"));
  const std::string three = "\\p{N}{1,3}";
  ASSERT_NE(llama3.find(three), std::string::npos);
  expect_refused(
      scratch.write("qwen.json",
                    llama3.substr(0, llama3.find(three)) + "\\p{N}" +
                        llama3.substr(llama3.find(three) + three.size())),
      "a Split by the pattern \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n"
      "\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^");
  expect_refused(
      scratch.write("prefix.json", with("\"add_prefix_space\": false",
                                        "\"add_prefix_space\": true")),
      "with add_prefix_space or without its pattern");
  expect_refused(
      scratch.write("nfc.json", with("\"normalizer\": null",
                                     "\"normalizer\": {\"type\": \"NFC\"}")),
      "normalizes the text first (its normalizer is 'NFC')");
  expect_refused(
      scratch.write("fallback.json", with("\"byte_fallback\": false",
                                          "\"byte_fallback\": true")),
      "has byte_fallback");
}

TEST(Tokenizer, LoadsEitherKindByItsContent) {
  for (const auto& path : every_format()) {
    const auto tokenizer = lamp::data::Tokenizer::load(path);
    EXPECT_FALSE(tokenizer.byte_pair().empty()) << path;
    EXPECT_TRUE(tokenizer.sentencepiece().empty()) << path;
    EXPECT_EQ(tokenizer.vocab_size(), 600);
    EXPECT_EQ(tokenizer.describe(), "byte-level BPE (GPT-2's split), 600 ids");
    EXPECT_EQ(tokenizer.decode(ids_of({39, 450, 346, 274, 269, 437})),
              "Hello world");
  }
  // Any other file is read as a SentencePiece model, and refused as one.
  Scratch scratch("kinds");
  const auto message = error_of([&] {
    lamp::data::Tokenizer::load(scratch.write("x.model", "\x01\x02garbage"));
  });
  EXPECT_NE(message.find("x.model"), std::string::npos) << message;
  // Hugging Face's merges.txt for its vocab.json: named as such.
  const auto merges =
      error_of([&] { lamp::data::Tokenizer::load(file("merges.txt")); });
  EXPECT_NE(merges.find("it looks like a merges file: give the vocab.json "
                        "beside it"),
            std::string::npos)
      << merges;
  if (lamp::data::sentencepiece_available()) {
    const auto model = lamp::data::train_sentencepiece(
        std::string(2000, 'a') + " the lamp trains\n",
        lamp::data::SentencePieceTrainOptions().vocab_size(270));
    const auto path = scratch.dir() + "/sp.model";
    model.save(path);
    const auto tokenizer = lamp::data::Tokenizer::load(path);
    EXPECT_FALSE(tokenizer.sentencepiece().empty());
    EXPECT_TRUE(tokenizer.byte_pair().empty());
    EXPECT_EQ(tokenizer.describe(), model.describe());
    EXPECT_EQ(tokenizer.vocab_size(), model.vocab_size());
  }
  const lamp::data::Tokenizer none;
  EXPECT_TRUE(none.empty());
}

TEST(Tokenizer, CutsATextIntoWindowsWithABytePairEncoding) {
  if (!can_encode()) {
    GTEST_SKIP() << "this lamp was built without ICU";
  }
  const auto tokenizer = lamp::data::Tokenizer::load(file("tokenizer.json"));
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "The model trains in mixed precision, step " + std::to_string(i) +
            ".\n";
  }
  const auto bytes =
      torch::from_blob(const_cast<char*>(text.data()),
                       {static_cast<int64_t>(text.size())}, torch::kUInt8)
          .clone();
  const auto data =
      lamp::data::tokenized_text_windows(bytes, "steps.txt", tokenizer, 8);
  const int64_t split = lamp::data::text_split_point(bytes, 0.1);
  const auto train_ids = tokenizer.encode(text.substr(0, split));
  EXPECT_EQ(data.train_tokens, train_ids.numel());
  EXPECT_EQ(data.validation_tokens,
            tokenizer.encode(text.substr(split)).numel());
  const auto expected = lamp::data::text_windows(train_ids, 8);
  EXPECT_EQ(data.train.inputs.scalar_type(), torch::kShort);
  EXPECT_TRUE(
      torch::equal(data.train.inputs.to(torch::kLong), expected.inputs));
  EXPECT_TRUE(
      torch::equal(data.train.targets.to(torch::kLong), expected.targets));
}

} // namespace
