#include "lamp/data/datasets.h"

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/files.h"
#include "lamp/platform/out_of_memory.h"
#include "platform/memory.h"

// CIFAR-10, binary version.

namespace lamp {
namespace data {
namespace {

using namespace internal;

constexpr int64_t kCifarImageBytes = 3 * 32 * 32;
constexpr int64_t kCifarRecordBytes = 1 + kCifarImageBytes;
constexpr int64_t kCifarClasses = 10;
constexpr const char* kCifarBinaryUrl =
    "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";

std::string cifar_missing_message(const std::string& directory, bool train,
                                  const std::vector<std::string>& files,
                                  const std::vector<std::string>& missing) {
  std::ostringstream m;
  m << "lamp::data::read_cifar10: " << (train ? "train" : "test")
    << " data not found in " << quoted(directory) << ": missing "
    << join(missing, ", ") << " (it looks for " << join(files, ", ") << "). "
    << describe_directory(directory) << ". ";
  // The Python version of the archive has pickled batches without ".bin"
  // and a pickled batches.meta (the binary one has batches.meta.txt).
  for (const auto& d :
       {directory, join_path(directory, "cifar-10-batches-py")}) {
    for (const char* name : {"data_batch_1", "test_batch", "batches.meta"}) {
      if (regular_file_exists(join_path(d, name))) {
        m << "Found " << quoted(join_path(d, name))
          << ": that is CIFAR-10's Python version (cifar-10-python.tar.gz, pickled batches), which lamp cannot read; it needs the binary version. ";
        break;
      }
    }
  }
  const auto extracted = join_path(directory, "cifar-10-batches-bin");
  if (directory_exists(extracted)) {
    m << "The extracted archive is in " << quoted(extracted)
      << ": pass that directory. ";
  }
  m << "Download the CIFAR-10 *binary* version, " << kCifarBinaryUrl
    << ", and extract it (tar xzf cifar-10-binary.tar.gz, which makes cifar-10-batches-bin/) so that the .bin files lie directly in the directory you pass.";
  return m.str();
}

std::vector<std::string> cifar10_names(bool train) {
  if (!train) {
    return {"test_batch.bin"};
  }
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) {
    names.push_back("data_batch_" + std::to_string(i) + ".bin");
  }
  return names;
}

} // namespace

std::vector<std::string> cifar10_files(const std::string& directory,
                                       bool train) {
  std::vector<std::string> files;
  for (const auto& name : cifar10_names(train)) {
    files.push_back(join_path(directory, name));
  }
  return files;
}

Dataset read_cifar10(const std::string& directory, bool train) {
  const char* caller = "lamp::data::read_cifar10";
  const auto names = cifar10_names(train);
  const auto files = cifar10_files(directory, train);
  std::vector<std::string> missing;
  for (size_t i = 0; i < files.size(); ++i) {
    refuse_non_file(
        files[i], caller,
        "put " + names[i] +
            " of CIFAR-10's binary version (cifar-10-binary.tar.gz) "
            "in its place");
    if (!regular_file_exists(files[i])) {
      missing.push_back(names[i]);
    }
  }
  TORCH_CHECK(missing.empty(),
              cifar_missing_message(directory, train, files, missing));

  std::vector<int64_t> records; // per file
  int64_t total_records = 0;
  uint64_t largest = 0;
  size_t largest_file = 0;
  for (const auto& f : files) {
    const uint64_t size = regular_file_size(f, caller);
    TORCH_CHECK(size > 0, caller, ": ", quoted(f),
                " is empty; extract cifar-10-binary.tar.gz (", kCifarBinaryUrl,
                ") again.");
    TORCH_CHECK(
        size % kCifarRecordBytes == 0, caller, ": ", quoted(f), " has ", size,
        " bytes, not a multiple of 3073 (1 label byte + 3072 pixel bytes per record), so it is not a CIFAR-10 binary batch",
        size % (kCifarRecordBytes + 1) == 0
            ? " (it is a multiple of 3074, CIFAR-100's record size, which lamp does not read)"
            : "",
        "; extract cifar-10-binary.tar.gz (", kCifarBinaryUrl, ") again.");
    if (size > largest) {
      largest = size;
      largest_file = records.size();
    }
    records.push_back(static_cast<int64_t>(size / kCifarRecordBytes));
    total_records += records.back();
  }
  // Before allocating: a sparse or corrupt file can claim any size.
  const auto total_bytes =
      static_cast<uint64_t>(total_records) * kCifarRecordBytes;
  TORCH_CHECK(
      total_bytes <= lamp::detail::physical_memory_bytes(), caller, ": ",
      quoted(files[largest_file]), " is ", byte_count(largest), " (the ",
      files.size(), " files hold ", byte_count(total_bytes), "), more than ",
      memory_text(),
      "; a CIFAR-10 batch is 30,730,000 bytes (10,000 records), so the file is corrupt or not a CIFAR-10 batch: extract cifar-10-binary.tar.gz (",
      kCifarBinaryUrl, ") again.");

  // All files into one buffer, then one pass to split labels from pixels.
  auto raw = with_memory_context(
      "the CIFAR-10 records", total_records * kCifarRecordBytes, [&] {
        return torch::empty({total_records, kCifarRecordBytes}, torch::kUInt8);
      });
  uint8_t* dst = raw.data_ptr<uint8_t>();
  for (size_t i = 0; i < files.size(); ++i) {
    const auto bytes = static_cast<uint64_t>(records[i] * kCifarRecordBytes);
    read_whole_file(files[i], bytes, dst, caller);
    dst += bytes;
  }

  auto labels = raw.select(1, 0).to(torch::kLong);
  const auto bad = (labels >= kCifarClasses).nonzero();
  if (bad.numel() > 0) {
    int64_t record = bad[0][0].item<int64_t>();
    const int64_t label = labels[record].item<int64_t>();
    size_t file = 0;
    while (record >= records[file]) {
      record -= records[file++];
    }
    TORCH_CHECK(
        false, caller, ": record ", record, " of ", quoted(files[file]),
        " (byte offset ", record * kCifarRecordBytes, ") has label ", label,
        ", but CIFAR-10's labels are 0-9; the file is corrupt or not a CIFAR-10 binary batch: extract cifar-10-binary.tar.gz (",
        kCifarBinaryUrl, ") again.");
  }
  auto images = raw.narrow(1, 1, kCifarImageBytes)
                    .reshape({total_records, 3, 32, 32})
                    .contiguous();
  return {std::move(images), std::move(labels)};
}

} // namespace data
} // namespace lamp
