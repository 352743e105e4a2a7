// Compressed text (internal::TextReader, read_text_bytes()): gzip and zstd
// files read as their text, several members or frames one after another as
// their concatenation, known by their bytes and not their names; damaged,
// truncated and trailing data refused naming the file; the formats lamp
// does not read named with the way to convert them.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <dirent.h>

#include <atomic>
#include <random>
#include <string>
#include <vector>

#include "compress_util.h"
#include "data/text_reader.h"
#include "test_util.h"

namespace {

using lamp::data::internal::Compression;
using lamp::data::internal::TextReader;
using lamp_test::error_of;
using lamp_test::gzip;
#if LAMP_TEST_EXPECT_ZSTD
using lamp_test::zstd;
#endif

constexpr const char* kCaller = "test";

class Scratch : public lamp_test::ScratchFolder {
 public:
  explicit Scratch(const std::string& name) : ScratchFolder("lamp_tr", name) {}
};

// Lines of words and numbers, some long, some empty: `bytes` of them.
std::string text_of(size_t bytes, uint32_t seed) {
  std::mt19937 random(seed);
  std::string text;
  while (text.size() < bytes) {
    const auto kind = random() % 8;
    if (kind == 0) {
      text += "\n";
    } else if (kind == 1) {
      text += std::to_string(random()) + "\n";
    } else {
      const auto words = 1 + random() % 40;
      for (uint32_t w = 0; w < words; ++w) {
        text += "word" + std::to_string(random() % 1000) + " ";
      }
      text += "caf\xc3\xa9.\n";
    }
  }
  text.resize(bytes);
  return text;
}

// The files this process holds open.
size_t open_files() {
  size_t n = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) {
      ++n;
    }
    ::closedir(dir);
  }
  return n;
}

// All of a file's text through read(), `block` bytes at a time.
std::string read_all(const std::string& path, size_t block) {
  TextReader reader(path, kCaller);
  std::string text;
  while (reader.read(text, block) > 0) {
  }
  return text;
}

// All of a file's lines through getline().
std::vector<std::string> lines_of(const std::string& path) {
  TextReader reader(path, kCaller);
  std::vector<std::string> lines;
  std::string line;
  while (reader.getline(line)) {
    lines.push_back(line);
  }
  return lines;
}

// `text` split at '\n' as getline() gives it: a last line without one
// too, none after a last '\n'.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

TEST(TextReader, ReadsGzipMembersAsTheirTextConcatenated) {
  Scratch scratch("gzip");
  // Over 3 MiB: more than one of the reader's 1 MiB blocks, in and out.
  const auto text = text_of(3 * (1 << 20) + 12345, 1);
  const size_t half = text.size() / 2 + 7;
  const auto one = scratch.write("one.txt.gz", gzip(text));
  const auto two = scratch.write(
      "two.gz", gzip(text.substr(0, half)) + gzip(text.substr(half)));
  for (const auto& path : {one, two}) {
    EXPECT_EQ(TextReader(path, kCaller).compression(), Compression::kGzip);
    // EXPECT_TRUE: a failure prints the path, not megabytes of text.
    EXPECT_TRUE(read_all(path, 1000003) == text) << path;
    EXPECT_TRUE(read_all(path, 64) == text) << path;
    EXPECT_TRUE(lines_of(path) == split_lines(text)) << path;
  }
  // read_text_bytes() and text_file_size() read it decompressed.
  const auto bytes = lamp::data::read_text_bytes(two);
  ASSERT_EQ(bytes.numel(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(bytes.data_ptr()), text.size()),
      text);
  std::atomic<int64_t> counted{5};
  EXPECT_EQ(lamp::data::internal::text_file_size(two, kCaller, &counted),
            static_cast<int64_t>(text.size()));
  EXPECT_EQ(counted.load(), static_cast<int64_t>(text.size()) + 5);
}

TEST(TextReader, ReadsZstdFramesAsTheirTextConcatenated) {
#if LAMP_TEST_EXPECT_ZSTD
  Scratch scratch("zstd");
  const auto text = text_of(2 * (1 << 20) + 999, 2);
  const size_t third = text.size() / 3;
  // A skippable frame (0x184D2A50, 4 bytes of data) first, as some tools
  // write their metadata.
  const std::string skippable("\x50\x2a\x4d\x18\x04\x00\x00\x00meta", 12);
  const auto one = scratch.write("one.jsonl.zst", zstd(text));
  const auto three =
      scratch.write("three.zst", skippable + zstd(text.substr(0, third)) +
                                     zstd(text.substr(third, third)) +
                                     zstd(text.substr(2 * third)));
  for (const auto& path : {one, three}) {
    EXPECT_EQ(TextReader(path, kCaller).compression(), Compression::kZstd);
    EXPECT_TRUE(read_all(path, 777777) == text) << path;
    EXPECT_TRUE(lines_of(path) == split_lines(text)) << path;
  }
  EXPECT_EQ(lamp::data::internal::text_file_size(three, kCaller),
            static_cast<int64_t>(text.size()));
#else
  EXPECT_FALSE(lamp::data::internal::zstd_available());
  Scratch scratch("zstd");
  const auto path =
      scratch.write("a.zst", std::string("\x28\xb5\x2f\xfd\x20\x00", 6));
  const auto message = error_of([&] { TextReader(path, kCaller); });
  EXPECT_NE(message.find("is compressed with zstd, and this lamp was built "
                         "without zstd. Install libzstd-dev"),
            std::string::npos)
      << message;
#endif
}

TEST(TextReader, KnowsCompressionByItsBytesNotItsName) {
  Scratch scratch("names");
  const std::string text = "plain text\nnamed as if compressed\n";
  const auto plain = scratch.write("plain.gz", text);
  EXPECT_EQ(TextReader(plain, kCaller).compression(), Compression::kNone);
  EXPECT_EQ(read_all(plain, 5), text);
  const auto gz = scratch.write("named.txt", gzip(text));
  EXPECT_EQ(read_all(gz, 5), text);
  // Texts that start as bzip2's and Parquet's magic do, and are texts.
  for (const std::string start : {"BZh9 is a name\n", "PAR1 of the text\n"}) {
    const auto path = scratch.write("start.txt", start + text);
    EXPECT_EQ(read_all(path, 100), start + text);
  }
  EXPECT_EQ(lamp::data::internal::text_file_size(plain, kCaller),
            static_cast<int64_t>(text.size()));
}

TEST(TextReader, RefusesDamagedAndTruncatedStreams) {
  Scratch scratch("damaged");
  const auto text = text_of(200000, 3);
  const auto good = gzip(text);
  const auto refused = [&](const std::string& name, const std::string& bytes) {
    const auto path = scratch.write(name, bytes);
    return error_of([&] { read_all(path, 1 << 16); });
  };
  // Each damaged file and what its message says.
  std::vector<std::pair<std::string, std::string>> cases = {
      {"cut.gz", good.substr(0, good.size() - 20)},
      {"flipped.gz", good},
      {"trailing.gz", good + "garbage after it"},
      {"one-byte.gz", good + "\x1f"},
  };
  auto& flipped = cases[1].second[good.size() / 2];
  flipped = static_cast<char>(flipped ^ 0x55);
  std::vector<std::string> expected = {
      "cut.gz' is truncated: its gzip stream stops after",
      "flipped.gz' is damaged: its gzip stream is corrupt (zlib: ",
      "trailing.gz' has data after the end of its gzip stream (at byte " +
          std::to_string(good.size()) + ")",
      "one-byte.gz' has data after the end of its gzip stream",
  };
#if LAMP_TEST_EXPECT_ZSTD
  const auto frame = zstd(text);
  auto bad = frame;
  for (size_t i = 20; i < bad.size(); i += 97) {
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  }
  cases.insert(cases.end(), {{"cut.zst", frame.substr(0, frame.size() - 20)},
                             {"bad.zst", bad},
                             {"trailing.zst", frame + "garbage after it"}});
  expected.insert(expected.end(),
                  {"cut.zst' is truncated: its zstd stream stops after",
                   "bad.zst' is damaged: its zstd stream is corrupt (zstd: ",
                   "trailing.zst' is damaged"});
#endif
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto message = refused(cases[k].first, cases[k].second);
    EXPECT_NE(message.find(expected[k]), std::string::npos) << message;
    EXPECT_NE(message.find("download it again"), std::string::npos) << message;
  }
}

TEST(TextReader, NamesTheFormatsItDoesNotReadAndTheirFix) {
  Scratch scratch("formats");
  struct Case {
    std::string name;
    std::string bytes;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"a.xz",
       std::string("\xfd"
                   "7zXZ\x00\x00\x04",
                   8),
       "a.xz' is compressed with xz: decompress it first (xz -d "},
      {"a.bz2", std::string("BZh91AY&SY\x00\x01", 12),
       "a.bz2' is compressed with bzip2: decompress it first (bzip2 -d "},
      {"a.lz4", std::string("\x04\x22\x4d\x18\x64\x40", 6),
       "a.lz4' is compressed with lz4: decompress it first (lz4 -d "},
      {"a.zip", std::string("PK\x03\x04\x14\x00", 6),
       "a.zip' is a zip archive: extract its files first (unzip "},
      {"a.7z", std::string("7z\xbc\xaf\x27\x1c\x00\x04", 8),
       "a.7z' is a 7z archive: extract its files first (7z x "},
      {"a.parquet", std::string("PAR1\x15\x04\x15\x00PAR1", 12),
       "a.parquet' is a Parquet file (a table), and lamp reads text and "
       "JSON Lines. Write its text column as JSON Lines first"},
  };
  const size_t fds = open_files();
  for (const auto& c : cases) {
    const auto path = scratch.write(c.name, c.bytes);
    const auto message = error_of([&] { TextReader(path, kCaller); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    // read_text_bytes() (train_gpt --data) says the same.
    const auto read = error_of([&] { lamp::data::read_text_bytes(path); });
    EXPECT_NE(read.find(c.expected), std::string::npos) << read;
  }
  // A refused file is closed again.
  EXPECT_EQ(open_files(), fds);
}

TEST(TextReader, GetlineKeepsLongLinesAndALastLineWithoutItsBreak) {
  Scratch scratch("lines");
  // A line longer than the reader's blocks, blank lines, CRLF (the '\r'
  // kept), and a last line without '\n'.
  const std::string long_line(3 * (1 << 20) + 5, 'x');
  const std::string text =
      "first\n\n" + long_line + "\nwith CR\r\n\n\nlast without a break";
  for (const auto& path : {scratch.write("plain.txt", text),
                           scratch.write("text.gz", gzip(text))}) {
    const auto lines = lines_of(path);
    ASSERT_EQ(lines.size(), 7u) << path;
    EXPECT_EQ(lines[0], "first");
    EXPECT_EQ(lines[1], "");
    EXPECT_TRUE(lines[2] == long_line);
    EXPECT_EQ(lines[3], "with CR\r");
    EXPECT_EQ(lines[6], "last without a break");
  }
  // A text that ends with '\n' has no empty line after it.
  EXPECT_EQ(lines_of(scratch.write("ended.txt", "a\nb\n")),
            (std::vector<std::string>{"a", "b"}));
  // getline() then read() go on where it stopped.
  TextReader reader(scratch.write("mixed.gz", gzip("one\ntwo\nthree")),
                    kCaller);
  std::string line;
  ASSERT_TRUE(reader.getline(line));
  std::string rest;
  reader.read(rest, 100);
  EXPECT_EQ(rest, "two\nthree");
}

} // namespace
