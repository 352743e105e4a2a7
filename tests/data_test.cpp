#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <ftw.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "lamp/data/datasets.h"
#include "lamp/data/loader.h"
#include "lamp/data/text.h"
#include "lamp/data/tokens.h"
#include "lamp/platform/address_space.h"
#include "test_util.h"

namespace {

using lamp_test::AllClose;
using lamp_test::BitEqual;
using Bytes = std::vector<uint8_t>;

// POSIX rather than std::filesystem, whose copy exported by the PyTorch 2.x
// wheels crashes in remove_all() (pytorch/pytorch#133437).

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path);
}

// A fresh, uniquely named directory for one test (mkdtemp under
// ::testing::TempDir()), removed with its contents when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string base = ::testing::TempDir();
    if (base.empty() || base.back() != '/') {
      base += '/';
    }
    std::string name = base + "lamp_data_" + info->test_suite_name() + "_" +
                       info->name() + "_XXXXXX";
    if (::mkdtemp(&name[0]) == nullptr) {
      throw std::runtime_error("mkdtemp failed for " + name);
    }
    path_ = name;
  }
  ~TempDir() { ::nftw(path_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& str() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    throw std::runtime_error("cannot write " + path);
  }
}

// Writes `bytes` gzip-compressed with zlib; mode "ab" appends a second gzip
// member to an existing file.
void write_gzip(const std::string& path, const Bytes& bytes,
                const char* mode = "wb") {
  gzFile f = gzopen(path.c_str(), mode);
  if (f == nullptr) {
    throw std::runtime_error("gzopen failed for " + path);
  }
  const int written =
      bytes.empty()
          ? 0
          : gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(f);
  if (written != static_cast<int>(bytes.size()) || closed != Z_OK) {
    throw std::runtime_error("gzwrite/gzclose failed for " + path);
  }
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// An IDX file of unsigned bytes: 0x00 0x00 0x08 <ndims>, big-endian int32
// sizes, then the data.
Bytes idx_bytes(const std::vector<uint32_t>& sizes, const Bytes& data) {
  Bytes out = {0x00, 0x00, 0x08, static_cast<uint8_t>(sizes.size())};
  for (uint32_t s : sizes) {
    out.push_back(static_cast<uint8_t>(s >> 24));
    out.push_back(static_cast<uint8_t>(s >> 16));
    out.push_back(static_cast<uint8_t>(s >> 8));
    out.push_back(static_cast<uint8_t>(s));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes counting_bytes(size_t n, uint8_t start = 0) {
  Bytes out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<uint8_t>(start + i);
  }
  return out;
}

// The uint8 tensor holding `data` with `sizes` (the IDX file's meaning).
torch::Tensor as_tensor(const Bytes& data, std::vector<int64_t> sizes) {
  return torch::tensor(std::vector<int64_t>(data.begin(), data.end()))
      .to(torch::kUInt8)
      .reshape(sizes);
}

// The machine's physical memory, the bound the readers check sizes against.
uint64_t physical_memory_bytes() {
  return static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE));
}

// At least 100 GiB and four times the physical memory: a size no reader may
// try to allocate.
uint64_t more_than_memory() {
  return std::max<uint64_t>(uint64_t{100} << 30, 4 * physical_memory_bytes());
}

// Writes `head`, then extends the file with a hole to `size` bytes: a sparse
// file that costs no disk space. False where the file system refuses.
bool write_sparse_file(const std::string& path, const Bytes& head,
                       uint64_t size) {
  write_file(path, head);
  return ::truncate(path.c_str(), static_cast<off_t>(size)) == 0;
}

void expect_error(const std::function<void()>& f,
                  std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << *fragments.begin()
                  << "'";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    for (const auto& fragment : fragments) {
      EXPECT_NE(what.find(fragment), std::string::npos)
          << "missing '" << fragment << "' in: " << e.what_without_backtrace();
    }
  }
}

// ---------------------------------------------------------------- CIFAR-10

// Pixel (c, y, x) of CIFAR record `r` in these tests: distinct per plane,
// row and column, so a swapped plane or transposed image shows.
uint8_t cifar_pixel(int64_t r, int64_t c, int64_t y, int64_t x) {
  return static_cast<uint8_t>((r * 31 + c * 100 + y * 7 + x * 3) % 256);
}

// Records first..first+labels.size()-1 in CIFAR-10's binary format: a label
// byte, then R, G and B planes of 32x32 bytes, each row-major.
Bytes cifar_records(int64_t first, const std::vector<uint8_t>& labels) {
  Bytes out;
  for (size_t k = 0; k < labels.size(); ++k) {
    const int64_t r = first + static_cast<int64_t>(k);
    Bytes record(3073);
    record[0] = labels[k];
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t y = 0; y < 32; ++y) {
        for (int64_t x = 0; x < 32; ++x) {
          record[1 + c * 1024 + y * 32 + x] = cifar_pixel(r, c, y, x);
        }
      }
    }
    out.insert(out.end(), record.begin(), record.end());
  }
  return out;
}

// The same pixels computed as a tensor [n, 3, 32, 32].
torch::Tensor expected_cifar_images(int64_t n) {
  auto r = torch::arange(n).view({n, 1, 1, 1});
  auto c = torch::arange(3).view({1, 3, 1, 1});
  auto y = torch::arange(32).view({1, 1, 32, 1});
  auto x = torch::arange(32).view({1, 1, 1, 32});
  return (r * 31 + c * 100 + y * 7 + x * 3).remainder(256).to(torch::kUInt8);
}

TEST(Cifar10, FilesAreTheFiveTrainBatchesOrTheTestBatch) {
  const auto train = lamp::data::cifar10_files("/data/cifar", true);
  ASSERT_EQ(train.size(), 5u);
  EXPECT_EQ(train[0], "/data/cifar/data_batch_1.bin");
  EXPECT_EQ(train[4], "/data/cifar/data_batch_5.bin");
  EXPECT_EQ(lamp::data::cifar10_files("/data/cifar/", false),
            std::vector<std::string>{"/data/cifar/test_batch.bin"});
}

TEST(Cifar10, DecodesTrainBatchesInOrder) {
  TempDir dir;
  // 2 + 3 + 1 + 2 + 2 records, labels 0..9 in order across the five files.
  const std::vector<std::vector<uint8_t>> labels = {
      {0, 1}, {2, 3, 4}, {5}, {6, 7}, {8, 9}};
  int64_t first = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    write_file(dir.file("data_batch_" + std::to_string(i + 1) + ".bin"),
               cifar_records(first, labels[i]));
    first += static_cast<int64_t>(labels[i].size());
  }
  const auto data = lamp::data::read_cifar10(dir.str(), /*train=*/true);
  EXPECT_EQ(data.size(), 10);
  EXPECT_TRUE(BitEqual(data.inputs, expected_cifar_images(10)));
  EXPECT_TRUE(BitEqual(data.targets, torch::arange(10)));
  EXPECT_TRUE(data.inputs.is_contiguous());
  // Record 4 (the second of data_batch_2.bin), row 2, column 5:
  // 4*31 + 2*7 + 5*3 = 153 in R, +100 in G, +200 (mod 256) in B.
  EXPECT_EQ(data.inputs[4][0][2][5].item<int64_t>(), 153);
  EXPECT_EQ(data.inputs[4][1][2][5].item<int64_t>(), 253);
  EXPECT_EQ(data.inputs[4][2][2][5].item<int64_t>(), 97);
  EXPECT_EQ(data.targets[4].item<int64_t>(), 4);
}

TEST(Cifar10, DecodesTheTestBatch) {
  TempDir dir;
  write_file(dir.file("test_batch.bin"), cifar_records(0, {9, 0, 5}));
  const auto data = lamp::data::read_cifar10(dir.str(), /*train=*/false);
  ASSERT_EQ(data.inputs.sizes(), torch::IntArrayRef({3, 3, 32, 32}));
  EXPECT_EQ(data.inputs.scalar_type(), torch::kUInt8);
  EXPECT_EQ(data.targets.scalar_type(), torch::kLong);
  EXPECT_TRUE(BitEqual(data.inputs, expected_cifar_images(3)));
  EXPECT_TRUE(BitEqual(data.targets, torch::tensor({9, 0, 5}, torch::kLong)));
  // Record 2, row 31, column 31: 62 + 217 + 93 = 372 -> 116 in R.
  EXPECT_EQ(data.inputs[2][0][31][31].item<int64_t>(), 116);
  EXPECT_EQ(data.inputs[2][1][31][31].item<int64_t>(), 216);
  EXPECT_EQ(data.inputs[2][2][31][31].item<int64_t>(), 60);
}

TEST(Cifar10, MissingFilesNameEveryFileAndTheBinaryArchive) {
  TempDir dir;
  expect_error([&] { lamp::data::read_cifar10(dir.str(), true); },
               {dir.str(), "missing data_batch_1.bin, data_batch_2.bin",
                dir.file("data_batch_5.bin"),
                "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                "*binary* version", "is empty"});
  for (int i : {1, 2, 4, 5}) {
    write_file(dir.file("data_batch_" + std::to_string(i) + ".bin"),
               cifar_records(0, {1}));
  }
  expect_error(
      [&] { lamp::data::read_cifar10(dir.str(), true); },
      {"missing data_batch_3.bin (it looks for", dir.file("data_batch_1.bin")});
  expect_error([&] { lamp::data::read_cifar10(dir.str(), false); },
               {"missing test_batch.bin", "cifar-10-binary.tar.gz"});
  expect_error([&] { lamp::data::read_cifar10(dir.file("nowhere"), false); },
               {"does not exist"});
  // A folder in a batch file's place is named as one, not as missing (the
  // folder's listing, in the message, would show the name).
  ASSERT_EQ(::mkdir(dir.file("data_batch_3.bin").c_str(), 0755), 0);
  expect_error([&] { lamp::data::read_cifar10(dir.str(), true); },
               {dir.file("data_batch_3.bin") +
                "' is a folder, not the data "
                "file of that name; put data_batch_3.bin of CIFAR-10's "
                "binary version"});
}

TEST(Cifar10, RecognisesThePythonVersion) {
  TempDir dir;
  write_file(dir.file("data_batch_1"), {0x80, 0x02}); // a pickle
  write_file(dir.file("batches.meta"), {0x80, 0x02});
  expect_error([&] { lamp::data::read_cifar10(dir.str(), true); },
               {"Python version", "cifar-10-binary.tar.gz"});
}

TEST(Cifar10, PointsIntoTheExtractedArchiveFolder) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("cifar-10-batches-bin").c_str(), 0755), 0);
  expect_error([&] { lamp::data::read_cifar10(dir.str(), false); },
               {dir.file("cifar-10-batches-bin"), "pass that directory"});
}

TEST(Cifar10, RejectsFilesThatAreNotWholeRecords) {
  TempDir dir;
  auto bytes = cifar_records(0, {1, 2});
  bytes.pop_back(); // truncated by one byte
  write_file(dir.file("test_batch.bin"), bytes);
  expect_error([&] { lamp::data::read_cifar10(dir.str(), false); },
               {"6145 bytes, not a multiple of 3073", "test_batch.bin"});
  write_file(dir.file("test_batch.bin"), Bytes(2 * 3074, 0));
  expect_error([&] { lamp::data::read_cifar10(dir.str(), false); },
               {"not a multiple of 3073", "CIFAR-100"});
  write_file(dir.file("test_batch.bin"), {});
  expect_error([&] { lamp::data::read_cifar10(dir.str(), false); },
               {"test_batch.bin' is empty"});
}

TEST(Cifar10, RejectsLabelsAboveNine) {
  TempDir dir;
  for (int i = 1; i <= 5; ++i) {
    write_file(dir.file("data_batch_" + std::to_string(i) + ".bin"),
               cifar_records(0, {3, static_cast<uint8_t>(i == 3 ? 10 : 9)}));
  }
  expect_error(
      [&] { lamp::data::read_cifar10(dir.str(), true); },
      {"record 1 of", "data_batch_3.bin", "has label 10", "labels are 0-9"});
}

// A sparse test_batch.bin of 100 GiB or more (a whole number of records):
// refused, naming the file and its size, before anything is allocated.
TEST(Cifar10, RefusesFilesLargerThanMemory) {
  TempDir dir;
  const uint64_t records = more_than_memory() / 3073 + 1;
  if (!write_sparse_file(dir.file("test_batch.bin"), cifar_records(0, {1}),
                         records * 3073)) {
    GTEST_SKIP() << "the file system refuses a sparse file of "
                 << records * 3073 << " bytes";
  }
  expect_error([&] { lamp::data::read_cifar10(dir.str(), false); },
               {"test_batch.bin' is ", std::to_string(records * 3073),
                "more than this machine's", "of memory",
                "a CIFAR-10 batch is 30,730,000 bytes"});
}

// --------------------------------------------------------------------- IDX

TEST(Idx, ReadsPlainFiles) {
  TempDir dir;
  const auto data = counting_bytes(2 * 3 * 4, 250); // wraps past 255
  write_file(dir.file("images"), idx_bytes({2, 3, 4}, data));
  const auto images = lamp::data::read_idx(dir.file("images"));
  EXPECT_TRUE(BitEqual(images, as_tensor(data, {2, 3, 4})));
  EXPECT_EQ(images[0][0][0].item<int64_t>(), 250);
  EXPECT_EQ(images[1][2][3].item<int64_t>(), (250 + 23) % 256);

  write_file(dir.file("labels"), idx_bytes({5}, {7, 0, 9, 1, 255}));
  EXPECT_TRUE(BitEqual(lamp::data::read_idx(dir.file("labels")),
                       as_tensor({7, 0, 9, 1, 255}, {5})));

  write_file(dir.file("empty"), idx_bytes({0, 28, 28}, {}));
  EXPECT_EQ(lamp::data::read_idx(dir.file("empty")).sizes(),
            torch::IntArrayRef({0, 28, 28}));
}

TEST(Idx, ReadsGzipFilesByTheirMagicNotTheirName) {
  TempDir dir;
  const auto data = counting_bytes(3 * 28 * 28, 17);
  const auto expected = as_tensor(data, {3, 28, 28});
  write_gzip(dir.file("images.gz"), idx_bytes({3, 28, 28}, data));
  write_gzip(dir.file("images-no-suffix"), idx_bytes({3, 28, 28}, data));
  write_file(dir.file("plain-named.gz"), idx_bytes({3, 28, 28}, data));
  ASSERT_EQ(read_bytes(dir.file("images-no-suffix"))[0], 0x1f);
  EXPECT_TRUE(BitEqual(lamp::data::read_idx(dir.file("images.gz")), expected));
  EXPECT_TRUE(
      BitEqual(lamp::data::read_idx(dir.file("images-no-suffix")), expected));
  EXPECT_TRUE(
      BitEqual(lamp::data::read_idx(dir.file("plain-named.gz")), expected));
}

TEST(Idx, ReadsConcatenatedGzipMembersAsOneFile) {
  TempDir dir;
  const auto file = idx_bytes({4, 100}, counting_bytes(400));
  const Bytes head(file.begin(), file.begin() + 150);
  const Bytes tail(file.begin() + 150, file.end());
  write_gzip(dir.file("two-members.gz"), head, "wb");
  write_gzip(dir.file("two-members.gz"), tail, "ab");
  EXPECT_TRUE(BitEqual(lamp::data::read_idx(dir.file("two-members.gz")),
                       as_tensor(counting_bytes(400), {4, 100})));
}

TEST(Idx, RejectsWrongMagicAndUnsupportedTypes) {
  TempDir dir;
  write_file(dir.file("text"), {'h', 'e', 'l', 'l', 'o', '!', '!', '!'});
  expect_error([&] { lamp::data::read_idx(dir.file("text")); },
               {"wrong magic", "0x68 0x65 0x6c 0x6c", dir.file("text")});
  auto ints = idx_bytes({2}, Bytes(8, 0));
  ints[2] = 0x0C;
  write_file(dir.file("ints"), ints);
  expect_error([&] { lamp::data::read_idx(dir.file("ints")); },
               {"unsupported IDX type code 0x0c (int32)", "0x08"});
  write_file(dir.file("scalar"), {0, 0, 8, 0, 42});
  expect_error([&] { lamp::data::read_idx(dir.file("scalar")); },
               {"0 dimensions"});
  write_file(dir.file("tiny"), {0, 0});
  expect_error([&] { lamp::data::read_idx(dir.file("tiny")); },
               {"too few for the 4-byte IDX magic"});
}

TEST(Idx, RejectsTruncatedFiles) {
  TempDir dir;
  auto header = idx_bytes({60000, 28, 28}, {});
  header.resize(10); // cut inside the sizes
  write_file(dir.file("header"), header);
  expect_error([&] { lamp::data::read_idx(dir.file("header")); },
               {"is truncated", "a header of 16 bytes", "only 10 bytes"});
  write_file(dir.file("data"), idx_bytes({3, 28, 28}, Bytes(2 * 28 * 28, 1)));
  expect_error(
      [&] { lamp::data::read_idx(dir.file("data")); },
      {"is truncated", "[3, 28, 28] need 2352 data bytes", "only 1568 follow"});
  // Sizes whose product overflows 64 bits.
  write_file(dir.file("huge"),
             idx_bytes({0x7fffffff, 0x7fffffff, 0x7fffffff}, {1}));
  expect_error([&] { lamp::data::read_idx(dir.file("huge")); },
               {"is truncated", "more than 2^64"});
  write_file(dir.file("negative"), idx_bytes({0x80000000u}, {1}));
  expect_error([&] { lamp::data::read_idx(dir.file("negative")); },
               {"int32 range"});
}

TEST(Idx, RejectsSizesInconsistentWithTheFileLength) {
  TempDir dir;
  write_file(dir.file("long"), idx_bytes({2, 2}, Bytes(7, 0)));
  expect_error([&] { lamp::data::read_idx(dir.file("long")); },
               {"holds 3 bytes more than its sizes [2, 2]",
                "inconsistent with the file length"});
  write_gzip(dir.file("long.gz"), idx_bytes({2, 2}, Bytes(5, 0)));
  expect_error([&] { lamp::data::read_idx(dir.file("long.gz")); },
               {"the decompressed contents of", "1 bytes more"});
}

// A sparse IDX file whose header and length agree on 100 GiB or more of
// images: refused by its header, before the file is read.
TEST(Idx, RefusesASparseFileLargerThanMemory) {
  TempDir dir;
  const uint32_t count =
      static_cast<uint32_t>(more_than_memory() / (1000 * 1000) + 1);
  const auto header = idx_bytes({count, 1000, 1000}, {});
  if (!write_sparse_file(dir.file("huge"), header,
                         header.size() + uint64_t{count} * 1000 * 1000)) {
    GTEST_SKIP() << "the file system refuses a sparse file of that size";
  }
  expect_error(
      [&] { lamp::data::read_idx(dir.file("huge")); },
      {dir.file("huge"),
       "declares the sizes [" + std::to_string(count) + ", 1000, 1000]",
       "more than this machine's", "of memory"});
}

// A gzip file whose header declares more than the memory holds is refused
// after decompressing the header, not after decompressing (or failing to
// allocate) the rest.
TEST(Idx, RefusesAGzipHeaderDeclaringMoreThanMemory) {
  TempDir dir;
  const uint32_t count =
      static_cast<uint32_t>(more_than_memory() / (1000 * 1000) + 1);
  write_gzip(dir.file("huge.gz"),
             idx_bytes({count, 1000, 1000}, Bytes(1 << 16, 0)));
  expect_error([&] { lamp::data::read_idx(dir.file("huge.gz")); },
               {"the header of the decompressed contents of", "huge.gz",
                "more than this machine's"});
}

// A small gzip file whose header declares 2 GB of data (that would fit in
// this machine's memory) but whose stream ends after 64 KiB is refused as
// truncated, having allocated about what it decompressed to: read under an
// address-space limit of 1 GiB above what the process maps, which an
// allocation of what the header claims would exceed.
TEST(Idx, AGzipFileClaimingMoreThanItHoldsAllocatesWhatItHolds) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow memory, so no "
                  "address-space limit can be set above what is mapped";
#endif
  constexpr uint64_t kClaimed = 2000ull * 1000 * 1000;
  if (physical_memory_bytes() <= kClaimed + (uint64_t{1} << 30)) {
    GTEST_SKIP() << "this machine's memory is too small for a 2 GB claim to "
                    "pass the memory check";
  }
  TempDir dir;
  write_gzip(dir.file("short.gz"),
             idx_bytes({2000, 1000, 1000}, counting_bytes(1 << 16)));
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &saved), 0);
  const auto soft =
      static_cast<rlim_t>(lamp::address_space().mapped + (int64_t{1} << 30));
  if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < soft) {
    GTEST_SKIP() << "the address-space limit is already below the test's";
  }
  struct rlimit lowered = saved;
  lowered.rlim_cur = soft;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &lowered), 0);
  std::string message;
  try {
    lamp::data::read_idx(dir.file("short.gz"));
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &saved), 0);
  for (const std::string part :
       {"short.gz", "is truncated", "need 2000000000 data bytes",
        "only 65536 follow"}) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "'" << part << "' not in: " << message;
  }
}

TEST(Idx, RejectsCorruptOrTruncatedGzip) {
  TempDir dir;
  write_gzip(dir.file("good.gz"), idx_bytes({50}, counting_bytes(50)));
  const auto good = read_bytes(dir.file("good.gz"));
  ASSERT_GT(good.size(), 30u);

  auto bad_crc = good;
  bad_crc[bad_crc.size() - 8] ^= 0xff; // the trailer's CRC-32
  write_file(dir.file("bad-crc.gz"), bad_crc);
  expect_error([&] { lamp::data::read_idx(dir.file("bad-crc.gz")); },
               {"gzip stream in", "is corrupt", "incorrect data check"});

  auto bad_method = good;
  bad_method[2] = 7; // compression method 8 (deflate) is the only one
  write_file(dir.file("bad-method.gz"), bad_method);
  expect_error([&] { lamp::data::read_idx(dir.file("bad-method.gz")); },
               {"is corrupt", "unknown compression method"});

  write_file(dir.file("cut.gz"), Bytes(good.begin(), good.end() - 12));
  expect_error([&] { lamp::data::read_idx(dir.file("cut.gz")); },
               {"is truncated", "without the end-of-stream marker"});

  write_file(dir.file("magic-only.gz"), {0x1f, 0x8b});
  expect_error([&] { lamp::data::read_idx(dir.file("magic-only.gz")); },
               {"is truncated"});

  auto trailing = good;
  trailing.push_back('x');
  write_file(dir.file("trailing.gz"), trailing);
  expect_error([&] { lamp::data::read_idx(dir.file("trailing.gz")); },
               {"1 bytes of trailing data"});
}

TEST(Idx, RejectsMissingFilesAndDirectories) {
  TempDir dir;
  expect_error([&] { lamp::data::read_idx(dir.file("absent")); },
               {dir.file("absent"), "does not exist"});
  expect_error([&] { lamp::data::read_idx(dir.str()); },
               {"is not a regular file"});
}

TEST(Mnist, AFolderInAFilesPlaceIsNamed) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("t10k-images-idx3-ubyte").c_str(), 0755), 0);
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, {0, 1}));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {dir.file("t10k-images-idx3-ubyte") + "' is a folder",
                "put the IDX file t10k-images-idx3-ubyte (or its .gz) there "
                "instead"});
}

// ------------------------------------------------------------------- MNIST

TEST(Mnist, ReadsPlainAndGzippedFiles) {
  TempDir dir;
  const auto train_images = counting_bytes(4 * 28 * 28, 3);
  write_gzip(dir.file("train-images-idx3-ubyte.gz"),
             idx_bytes({4, 28, 28}, train_images));
  write_file(dir.file("train-labels-idx1-ubyte"), idx_bytes({4}, {3, 1, 4, 1}));
  const auto test_examples = counting_bytes(2 * 28 * 28, 99);
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({2, 28, 28}, test_examples));
  write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({2}, {9, 0}));

  const auto train = lamp::data::read_mnist(dir.str(), /*train=*/true);
  EXPECT_EQ(train.size(), 4);
  EXPECT_TRUE(BitEqual(train.inputs, as_tensor(train_images, {4, 1, 28, 28})));
  EXPECT_TRUE(
      BitEqual(train.targets, torch::tensor({3, 1, 4, 1}, torch::kLong)));

  const auto test = lamp::data::read_mnist(dir.str(), /*train=*/false);
  EXPECT_TRUE(BitEqual(test.inputs, as_tensor(test_examples, {2, 1, 28, 28})));
  EXPECT_TRUE(BitEqual(test.targets, torch::tensor({9, 0}, torch::kLong)));
}

TEST(Mnist, PrefersThePlainFileWhenBothExist) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({2, 28, 28}, Bytes(2 * 28 * 28, 1)));
  write_gzip(dir.file("t10k-images-idx3-ubyte.gz"),
             idx_bytes({3, 28, 28}, Bytes(3 * 28 * 28, 2)));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, {0, 1}));
  const auto test = lamp::data::read_mnist(dir.str(), false);
  EXPECT_EQ(test.size(), 2);
  EXPECT_EQ(test.inputs.max().item<int64_t>(), 1);
}

TEST(Mnist, AcceptsAnyImageSize) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({2, 5, 7}, counting_bytes(70)));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, {0, 1}));
  const auto test = lamp::data::read_mnist(dir.str(), false);
  EXPECT_TRUE(
      BitEqual(test.inputs, as_tensor(counting_bytes(70), {2, 1, 5, 7})));
}

TEST(Mnist, MissingFilesNameEveryNameLookedFor) {
  TempDir dir;
  write_file(dir.file("train-labels-idx1-ubyte"), idx_bytes({1}, {0}));
  expect_error([&] { lamp::data::read_mnist(dir.str(), true); },
               {"train data not found in '" + dir.str(),
                "missing train-images-idx3-ubyte[.gz] (it looks for",
                dir.file("train-images-idx3-ubyte"),
                dir.file("train-images-idx3-ubyte.gz"),
                dir.file("train-labels-idx1-ubyte.gz"),
                "holds train-labels-idx1-ubyte", "dataset-fashion-mnist"});
  expect_error(
      [&] { lamp::data::read_mnist(dir.str(), false); },
      {"missing t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]"});
}

TEST(Mnist, RejectsMismatchedCountsAndWrongRanks) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({3, 28, 28}, Bytes(3 * 28 * 28, 0)));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({2}, {0, 1}));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {"holds 3 images but", "holds 2 labels"});

  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({3, 1}, {0, 1, 2}));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {"must be 1-dimensional"});

  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({3, 784}, Bytes(3 * 784, 0)));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {"must be 3-dimensional", "[3, 784]"});

  write_file(dir.file("t10k-images-idx3-ubyte"), idx_bytes({0, 28, 28}, {}));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({0}, {}));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {"holds no images"});
}

// Every label is checked when the files are read, not when a bad one is
// first drawn into a batch.
TEST(Mnist, RejectsLabelsAboveNineNamingTheFileAndRecord) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({20, 28, 28}, Bytes(20 * 28 * 28, 1)));
  Bytes labels(20, 9);
  labels[17] = 200;
  labels[18] = 10;
  write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes({20}, labels));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {dir.file("t10k-labels-idx1-ubyte.gz") +
                    "': label 200 at record 17 is outside 0..9",
                "the file is corrupt or not MNIST-format labels"});
}

// 10, one past the last class, is refused alone; 9, the last, is read.
TEST(Mnist, RejectsALabelOfTenAndReadsNine) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte"),
             idx_bytes({20, 28, 28}, Bytes(20 * 28 * 28, 1)));
  Bytes labels(20, 9);
  labels[18] = 10;
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({20}, labels));
  expect_error([&] { lamp::data::read_mnist(dir.str(), false); },
               {"': label 10 at record 18 is outside 0..9"});
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_bytes({20}, Bytes(20, 9)));
  EXPECT_EQ(
      lamp::data::read_mnist(dir.str(), false).targets.max().item<int64_t>(),
      9);
}

TEST(Mnist, DefaultFashionMnistDirectoryIsDebiansWhenInstalled) {
  const bool installed = is_directory("/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(lamp::data::default_fashion_mnist_directory(),
            installed ? "/usr/share/datasets/fashion-mnist" : "");
}

TEST(Mnist, ReadsDebiansFashionMnist) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!is_directory(dir)) {
    GTEST_SKIP() << dir << " is absent (apt-get install dataset-fashion-mnist)";
  }
  const auto train = lamp::data::read_mnist(dir, /*train=*/true);
  ASSERT_EQ(train.inputs.sizes(), torch::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(train.inputs.scalar_type(), torch::kUInt8);
  ASSERT_EQ(train.targets.sizes(), torch::IntArrayRef({60000}));
  EXPECT_EQ(train.targets.scalar_type(), torch::kLong);
  EXPECT_EQ(train.targets.min().item<int64_t>(), 0);
  EXPECT_EQ(train.targets.max().item<int64_t>(), 9);
  // Fashion-MNIST is balanced: 6,000 training images per class.
  EXPECT_TRUE(BitEqual(torch::bincount(train.targets),
                       torch::full({10}, 6000, torch::kLong)));
  // Images are not blank: Fashion-MNIST's mean pixel is about 72.9 (0.286).
  EXPECT_NEAR(train.inputs.to(torch::kDouble).mean().item<double>(), 72.94,
              0.1);

  const auto test = lamp::data::read_mnist(dir, /*train=*/false);
  ASSERT_EQ(test.inputs.sizes(), torch::IntArrayRef({10000, 1, 28, 28}));
  ASSERT_EQ(test.targets.sizes(), torch::IntArrayRef({10000}));
  EXPECT_EQ(test.targets.min().item<int64_t>(), 0);
  EXPECT_EQ(test.targets.max().item<int64_t>(), 9);
  EXPECT_TRUE(BitEqual(torch::bincount(test.targets),
                       torch::full({10}, 1000, torch::kLong)));
}

// ------------------------------------------------------ TensorImageDataset

// Two 3-channel 2x2 images, pixel value (n*12 + c*4 + i) * 7.
lamp::data::Dataset small_dataset() {
  auto images = (torch::arange(2 * 3 * 2 * 2) * 7).to(torch::kUInt8);
  return {images.view({2, 3, 2, 2}), torch::tensor({4, 2}, torch::kLong)};
}

TEST(TensorImageDataset, ScalesToUnitRangeThenNormalisesPerChannel) {
  const std::vector<double> mean = {0.5, 0.25, 0.0};
  const std::vector<double> std = {0.5, 0.25, 2.0};
  lamp::data::TensorImageDataset dataset(small_dataset(), mean, std);
  ASSERT_TRUE(dataset.size().has_value());
  EXPECT_EQ(*dataset.size(), 2u);
  for (size_t n = 0; n < 2; ++n) {
    const auto example = dataset.get(n);
    EXPECT_EQ(example.data.scalar_type(), torch::kFloat);
    ASSERT_EQ(example.data.sizes(), torch::IntArrayRef({3, 2, 2}));
    auto expected = small_dataset().inputs[n].to(torch::kDouble) / 255;
    for (int64_t c = 0; c < 3; ++c) {
      expected[c] = (expected[c] - mean[c]) / std[c];
    }
    EXPECT_TRUE(AllClose(example.data, expected, 1e-6, 1e-6));
    EXPECT_EQ(example.target.scalar_type(), torch::kLong);
    EXPECT_EQ(example.target.dim(), 0);
  }
  // Golden values by hand: image 1, channel 1, pixel 0 is (12 + 4) * 7 = 112:
  // (112 / 255 - 0.25) / 0.25 = 0.756863; channel 2, pixel 3 is 161:
  // 161 / 255 / 2 = 0.315686.
  const auto second = dataset.get(1);
  EXPECT_NEAR(second.data[1][0][0].item<double>(), 0.756863, 1e-6);
  EXPECT_NEAR(second.data[2][1][1].item<double>(), 0.315686, 1e-6);
  EXPECT_EQ(second.target.item<int64_t>(), 2);
  EXPECT_EQ(dataset.get(0).target.item<int64_t>(), 4);
}

TEST(TensorImageDataset, ServesLibTorchsDataLoader) {
  lamp::data::TensorImageDataset dataset(small_dataset(), {0, 0, 0}, {1, 1, 1});
  auto loader =
      torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
          dataset.map(torch::data::transforms::Stack<>()),
          torch::data::DataLoaderOptions().batch_size(2));
  int batches = 0;
  for (auto& batch : *loader) {
    ++batches;
    ASSERT_EQ(batch.data.sizes(), torch::IntArrayRef({2, 3, 2, 2}));
    EXPECT_TRUE(AllClose(batch.data,
                         small_dataset().inputs.to(torch::kFloat) / 255, 1e-6,
                         1e-7));
    EXPECT_TRUE(BitEqual(batch.target, torch::tensor({4, 2}, torch::kLong)));
  }
  EXPECT_EQ(batches, 1);
}

TEST(TensorImageDataset, RejectsBadInputs) {
  expect_error(
      [] { lamp::data::TensorImageDataset(small_dataset(), {0.5}, {0.5}); },
      {"3 channels", "need 3 values each"});
  expect_error(
      [] {
        lamp::data::TensorImageDataset(small_dataset(), {0, 0, 0}, {1, 0, 1});
      },
      {"std[1] is 0", "finite and positive"});
  expect_error(
      [] {
        auto data = small_dataset();
        data.inputs = data.inputs.to(torch::kFloat);
        lamp::data::TensorImageDataset(data, {0, 0, 0}, {1, 1, 1});
      },
      {"images must be uint8 [N, C, H, W]"});
  expect_error(
      [] {
        auto data = small_dataset();
        data.targets = data.targets.to(torch::kInt);
        lamp::data::TensorImageDataset(data, {0, 0, 0}, {1, 1, 1});
      },
      {"labels must be int64", "to(torch::kLong)"});
  expect_error(
      [] {
        auto data = small_dataset();
        data.targets = torch::tensor({1}, torch::kLong);
        lamp::data::TensorImageDataset(data, {0, 0, 0}, {1, 1, 1});
      },
      {"2 images but 1 labels"});
  lamp::data::TensorImageDataset dataset(small_dataset(), {0, 0, 0}, {1, 1, 1});
  expect_error([&] { dataset.get(2); },
               {"index 2 is out of range", "2 examples"});
}

// ---- Token files (nanoGPT's train.bin, val.bin, meta.pkl) ----

// `ids` as little-endian integers of `width` bytes, as nanoGPT's
// prepare.py writes them (numpy's uint16 / uint32 tofile()).
Bytes token_bytes(const std::vector<int64_t>& ids, int width) {
  Bytes out;
  for (const auto id : ids) {
    for (int b = 0; b < width; ++b) {
      out.push_back(static_cast<uint8_t>((id >> (8 * b)) & 0xFF));
    }
  }
  return out;
}

// A pickle (protocol 2) of {"vocab_size": vocab_size, "itos": {id: piece}}
// written opcode by opcode, as Python's pickle writes such a dict.
Bytes meta_pickle(int64_t vocab_size,
                  const std::vector<std::pair<int64_t, std::string>>& itos) {
  Bytes out = {0x80, 0x02, '}', '('};
  const auto integer = [&](int64_t v) {
    out.push_back('J');
    for (int b = 0; b < 4; ++b) {
      out.push_back(static_cast<uint8_t>((v >> (8 * b)) & 0xFF));
    }
  };
  const auto text = [&](const std::string& s) {
    out.push_back('X');
    const auto n = static_cast<uint32_t>(s.size());
    for (int b = 0; b < 4; ++b) {
      out.push_back(static_cast<uint8_t>((n >> (8 * b)) & 0xFF));
    }
    out.insert(out.end(), s.begin(), s.end());
  };
  text("vocab_size");
  integer(vocab_size);
  if (!itos.empty()) {
    text("itos");
    out.push_back('}');
    out.push_back('(');
    for (const auto& entry : itos) {
      integer(entry.first);
      text(entry.second);
    }
    out.push_back('u');
  }
  out.push_back('u');
  out.push_back('.');
  return out;
}

// A token folder: train.bin and val.bin of `width`-byte ids.
void write_tokens(const TempDir& dir, const std::vector<int64_t>& train,
                  const std::vector<int64_t>& val, int width = 2) {
  write_file(dir.file("train.bin"), token_bytes(train, width));
  write_file(dir.file("val.bin"), token_bytes(val, width));
}

std::vector<int64_t> iota_ids(int64_t n, int64_t first, int64_t step,
                              int64_t modulo) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    ids.push_back((first + i * step) % modulo);
  }
  return ids;
}

torch::Tensor as_tensor(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::kLong);
}

// uint16 ids above int16's range (32,768 and up) and uint32 ids read back
// as written, mapped rather than copied: the tensor's data is the mapping,
// and writing to it changes a private copy, never the file.
TEST(TokenFiles, MapsUint16AndUint32IdsAsWritten) {
  TempDir dir;
  const std::vector<int64_t> ids = {0, 1, 255, 256, 32767, 32768, 50256, 65535};
  write_file(dir.file("a.bin"), token_bytes(ids, 2));
  auto mapped = lamp::data::map_token_file(dir.file("a.bin"), 2);
  EXPECT_EQ(mapped.scalar_type(), torch::kShort);
  EXPECT_TRUE(
      BitEqual(lamp::data::widen_token_ids(mapped, true), as_tensor(ids)));
  // Signed: int16's reading, which is why the loader widens.
  EXPECT_EQ(lamp::data::widen_token_ids(mapped, false)[5].item<int64_t>(),
            -32768);
  mapped.fill_(7);
  EXPECT_EQ(read_bytes(dir.file("a.bin")), token_bytes(ids, 2));

  const std::vector<int64_t> wide = {0, 65536, 70000, 2147483647};
  write_file(dir.file("b.bin"), token_bytes(wide, 4));
  const auto mapped32 = lamp::data::map_token_file(dir.file("b.bin"), 4);
  EXPECT_EQ(mapped32.scalar_type(), torch::kInt);
  EXPECT_TRUE(
      BitEqual(lamp::data::widen_token_ids(mapped32, true), as_tensor(wide)));
  EXPECT_EQ(lamp::data::token_id_bytes(65536), 2);
  EXPECT_EQ(lamp::data::token_id_bytes(65537), 4);
  EXPECT_EQ(lamp::data::padded_vocab_size(65), 128);
  EXPECT_EQ(lamp::data::padded_vocab_size(50257), 50304);
  EXPECT_EQ(lamp::data::padded_vocab_size(64), 64);
}

// The windows follow text_windows()'s rule on the same ids, are views of
// the mapping (the targets one id after the inputs, no copy), and a
// vocabulary above 32,768 marks its uint16 ids unsigned, which the loader
// serves widened.
TEST(TokenFiles, WindowsFollowTheTextRuleWithoutCopying) {
  TempDir dir;
  const auto train = iota_ids(103, 30000, 997, 40000);
  const auto val = iota_ids(41, 39990, 1, 40000);
  write_tokens(dir, train, val);
  EXPECT_TRUE(lamp::data::is_token_folder(dir.str()));
  EXPECT_FALSE(lamp::data::is_token_folder(dir.file("train.bin")));
  const auto data = lamp::data::read_token_files(dir.str(), 10, 40000);
  EXPECT_EQ(data.vocab_size, 40000);
  EXPECT_EQ(data.id_bytes, 2);
  EXPECT_EQ(data.train_tokens, 103);
  EXPECT_EQ(data.validation_tokens, 41);
  EXPECT_TRUE(data.train.unsigned_ids);
  EXPECT_TRUE(data.meta_path.empty());
  const auto expected = lamp::data::text_windows(as_tensor(train), 10);
  EXPECT_TRUE(BitEqual(lamp::data::widen_token_ids(data.train.inputs, true),
                       expected.inputs));
  EXPECT_TRUE(BitEqual(lamp::data::widen_token_ids(data.train.targets, true),
                       expected.targets));
  EXPECT_EQ(static_cast<const int16_t*>(data.train.targets.data_ptr()),
            static_cast<const int16_t*>(data.train.inputs.data_ptr()) + 1);
  EXPECT_EQ(data.validation.size(), 4);

  lamp::data::DeviceLoader loader(
      data.train, torch::kCPU,
      lamp::data::LoaderOptions(10).dtype(torch::kLong).shuffle(false));
  const auto batch = loader.batch(0);
  EXPECT_TRUE(BitEqual(batch.inputs, expected.inputs));
  EXPECT_TRUE(BitEqual(batch.targets, expected.targets));
  EXPECT_TRUE(loader.data().unsigned_ids);
  // The loader holds one copy of the ids (here none: the CPU's is the
  // mapping), the targets one id after the inputs.
  EXPECT_EQ(loader.data().inputs.data_ptr(), data.train.inputs.data_ptr());
  EXPECT_EQ(static_cast<const int16_t*>(loader.data().targets.data_ptr()),
            static_cast<const int16_t*>(loader.data().inputs.data_ptr()) + 1);
  EXPECT_NE(lamp::data::fingerprint(loader.data()).find("tokens (uint16)"),
            std::string::npos);

  // Up to 32,768 ids int16 holds them as they are.
  write_tokens(dir, iota_ids(103, 0, 997, 32768), val);
  expect_error([&] { lamp::data::read_token_files(dir.str(), 10, 32768); },
               {"val.bin", "holds the id 39990 at token 0"});
  write_tokens(dir, iota_ids(103, 0, 997, 32768), iota_ids(41, 0, 1, 32768));
  EXPECT_FALSE(
      lamp::data::read_token_files(dir.str(), 10, 32768).train.unsigned_ids);
  expect_error(
      [&] {
        lamp::data::read_token_files(
            dir.str(), std::numeric_limits<int64_t>::max(), 32768);
      },
      {"read_token_files: context must be in 1 ... 2^40"});
}

// meta.pkl gives the vocabulary (over the one given) and its pieces: the
// prompt is encoded by the longest piece at each position, the samples
// decoded piece by piece, an id without a piece shown as <id>.
TEST(TokenFiles, MetaPklGivesTheVocabularyAndItsPieces) {
  TempDir dir;
  write_tokens(dir, iota_ids(50, 0, 1, 5), iota_ids(20, 0, 3, 5));
  write_file(dir.file("meta.pkl"),
             meta_pickle(5, {{0, "a"}, {1, "b"}, {2, "ab"}, {3, "\xc3\xa9"}}));
  const auto data = lamp::data::read_token_files(dir.str(), 4, 1000);
  EXPECT_EQ(data.vocab_size, 5);
  EXPECT_EQ(data.meta_path, dir.file("meta.pkl"));
  EXPECT_FALSE(data.train.unsigned_ids);
  // As long as the largest id itos names, 3, + 1: id 4 has no piece.
  ASSERT_EQ(data.pieces.pieces.size(), 4u);
  EXPECT_TRUE(BitEqual(data.pieces.encode("aab\xc3\xa9"
                                          "b"),
                       as_tensor({0, 2, 3, 1})));
  EXPECT_EQ(data.pieces.decode(as_tensor({2, 4, 0, 9})), "ab<4>a<9>");
  expect_error([&] { data.pieces.encode("abc"); },
               {"the text's 'c' at byte 2 is in no piece", "4 pieces"});
  write_file(dir.file("meta.pkl"), meta_pickle(5, {}));
  lamp::data::TokenPieces none;
  EXPECT_EQ(lamp::data::read_token_meta(dir.file("meta.pkl"), &none), 5);
  EXPECT_TRUE(none.empty());
  // A damaged vocab_size of 2^31 - 1 beside a short itos: the pieces are
  // itos's, not two billion empty strings (64 GiB).
  write_file(dir.file("meta.pkl"), meta_pickle(2147483647, {{1, "b"}}));
  lamp::data::TokenPieces few;
  EXPECT_EQ(lamp::data::read_token_meta(dir.file("meta.pkl"), &few),
            2147483647);
  ASSERT_EQ(few.pieces.size(), 2u);
  EXPECT_EQ(few.decode(as_tensor({1, 0, 5})), "b<0><5>");
}

// Bad token files: each refused naming the file and the fix.
TEST(TokenFiles, RefusesBadFilesNamingThemAndTheFix) {
  TempDir dir;
  const auto ids = iota_ids(40, 0, 1, 7);
  const auto read = [&](int64_t vocab) {
    return [&dir, vocab] { lamp::data::read_token_files(dir.str(), 8, vocab); };
  };
  expect_error(read(7), {"is not a folder of token files", "train.bin"});
  write_tokens(dir, ids, ids);
  auto odd = token_bytes(ids, 2);
  odd.push_back(1);
  write_file(dir.file("train.bin"), odd);
  expect_error(read(7), {"train.bin", "81 bytes",
                         "not a whole number of 2-byte uint16 ids",
                         "Prepare the file again"});
  auto beyond = ids;
  beyond[33] = 7;
  write_tokens(dir, ids, beyond);
  expect_error(read(7), {"val.bin", "holds the id 7 at token 33",
                         "not below the vocabulary's 7"});
  write_tokens(dir, ids, {});
  expect_error(read(7), {"val.bin", "is empty"});
  write_tokens(dir, ids, iota_ids(8, 0, 1, 7));
  expect_error(read(7), {"val.bin", "holds 8 uint16 ids",
                         "no window of context 8", "shorter --context"});
  write_tokens(dir, ids, ids);
  expect_error(read(0),
               {"has no meta.pkl", "give --tokenizer FILE", "or --vocab-size"});
  write_file(dir.file("meta.pkl"), {0x80, 0x04, 0x95, 'x'});
  expect_error(read(0), {"meta.pkl", "is not a readable pickle"});
  write_file(dir.file("meta.pkl"), meta_pickle(0, {}));
  expect_error(read(0), {"meta.pkl", "has no vocab_size"});
  write_file(dir.file("meta.pkl"), meta_pickle(7, {{7, "x"}}));
  expect_error(read(0), {"meta.pkl", "itos", "not an id below vocab_size 7"});
  // uint32 files for a vocabulary above 65,536; a uint16 file read so is
  // not a whole number of ids when its length says so.
  std::remove(dir.file("meta.pkl").c_str());
  write_tokens(dir, iota_ids(41, 0, 1, 7), ids, 2);
  expect_error(read(70000), {"train.bin", "82 bytes",
                             "not a whole number of 4-byte uint32 ids"});
  auto wide = iota_ids(40, 65530, 1, 70000);
  write_tokens(dir, wide, wide, 4);
  EXPECT_EQ(lamp::data::read_token_files(dir.str(), 8, 70000).id_bytes, 4);
  wide[17] = 70000;
  write_tokens(dir, iota_ids(40, 0, 1, 7), wide, 4);
  expect_error(read(70000), {"val.bin", "holds the id 70000 at token 17"});
  // An id beyond int32's range is named as written, not as int32 reads it.
  wide[17] = 4294967295;
  write_tokens(dir, iota_ids(40, 0, 1, 7), wide, 4);
  expect_error(read(70000), {"val.bin", "holds the id 4294967295 at token 17"});
}

// The mapping reserves no memory: a (sparse) file twice the size of RAM and
// swap maps, writably, reads and widens, where a mapping that reserved its
// size would be refused by Linux's overcommit check.
TEST(TokenFiles, MapsAFileLargerThanMemory) {
  TempDir dir;
  struct sysinfo info {};
  ASSERT_EQ(::sysinfo(&info), 0);
  const uint64_t memory = (static_cast<uint64_t>(info.totalram) +
                           static_cast<uint64_t>(info.totalswap)) *
                          info.mem_unit;
  const uint64_t size = (2 * memory + 4095) / 4096 * 4096;
  const auto path = dir.file("train.bin");
  write_file(path, token_bytes({1, 2, 3}, 2));
  if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
    GTEST_SKIP() << "this file system holds no sparse file of " << size
                 << " bytes";
  }
  lamp_test::Warnings warnings;
  const auto ids = lamp::data::map_token_file(path, 2);
  std::remove(path.c_str()); // the mapping keeps the file
  // Writable (copy-on-write), not the read-only mapping of strict
  // overcommit, which this system does not have.
  const auto policy = read_bytes("/proc/sys/vm/overcommit_memory");
  if (policy.empty() || policy[0] != '2') {
    EXPECT_TRUE(warnings.containing("mapped read-only").empty());
  }
  EXPECT_EQ(ids.numel(), static_cast<int64_t>(size / 2));
  EXPECT_TRUE(BitEqual(lamp::data::widen_token_ids(ids.slice(0, 0, 4), true),
                       as_tensor({1, 2, 3, 0})));
  EXPECT_EQ(ids[ids.numel() - 1].item<int64_t>(), 0);
}

// Above 2^26 targets, the fingerprint covers the sampled examples' targets
// and says so (a token file of billions of ids is not read whole).
TEST(TokenFiles, FingerprintOfBillionsOfTokensSamplesTheTargets) {
  const int64_t n = (int64_t{1} << 20) + 1, t = 64;
  lamp::data::Dataset big{torch::ones({1}, torch::kShort).expand({n, t}),
                          torch::ones({1}, torch::kShort).expand({n, t})};
  const auto text = lamp::data::fingerprint(big);
  EXPECT_NE(text.find("sequences of 64 tokens (int16), targets sample crc32"),
            std::string::npos)
      << text;
  const auto small = lamp::data::fingerprint(
      {big.inputs.slice(0, 0, 1024), big.targets.slice(0, 0, 1024)});
  EXPECT_NE(small.find("targets crc32"), std::string::npos) << small;
}

} // namespace

// A dataset's fingerprint: its size and CRC-32s of its labels and of a fixed
// sample of its images; equal data gives equal text, a changed label or
// sampled image another; CIFAR-10's size costs milliseconds.
TEST(DataFingerprint, TellsDatasetsOfOneSizeApart) {
  torch::manual_seed(3);
  lamp::data::Dataset data{
      torch::randint(0, 256, {3000, 1, 28, 28}).to(torch::kByte),
      torch::randint(0, 10, {3000}).to(torch::kLong)};
  const auto text = lamp::data::fingerprint(data);
  EXPECT_TRUE(std::regex_match(
      text, std::regex("3000 images 1x28x28, labels crc32 [0-9a-f]{8}, "
                       "images crc32 [0-9a-f]{8}")))
      << text;
  EXPECT_EQ(
      lamp::data::fingerprint({data.inputs.clone(), data.targets.clone()}),
      text);
  auto labels = data.targets.clone();
  labels[2999] = (labels[2999].item<int64_t>() + 1) % 10;
  EXPECT_NE(lamp::data::fingerprint({data.inputs, labels}), text);
  auto images = data.inputs.clone();
  images[0][0][14][14] =
      static_cast<uint8_t>(images[0][0][14][14].item<int>() ^ 1);
  EXPECT_NE(lamp::data::fingerprint({images, data.targets}), text);

  lamp::data::Dataset cifar{torch::zeros({50000, 3, 32, 32}, torch::kByte),
                            torch::zeros({50000}, torch::kLong)};
  const auto start = std::chrono::steady_clock::now();
  const auto cifar_text = lamp::data::fingerprint(cifar);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  EXPECT_EQ(cifar_text.substr(0, 26), "50000 images 3x32x32, labe");
  // 50 ms is the budget; twice that leaves room for a loaded machine.
  EXPECT_LT(ms, 100.0);
  EXPECT_NE(
      lamp_test::error_of([] {
        lamp::data::fingerprint({torch::zeros({2, 3}), torch::zeros({2})});
      }).find("lamp::data::fingerprint: the dataset must hold uint8 images"),
      std::string::npos);
}
