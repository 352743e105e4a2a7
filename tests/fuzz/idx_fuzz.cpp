// A libFuzzer target for lamp's MNIST-format reader (src/data/mnist_idx.cpp):
// IDX headers, their sizes against the file's length, and gzip streams
// (several members, truncated or corrupt ones) around them. Each input is
// written to a file and read with lamp::data::read_idx, as a user's download
// would be; a refusal must be a c10::Error, and a tensor read must hold
// exactly the bytes the header's sizes describe. Built and run by
// scripts/fuzz.sh --target idx.

#include <torch/torch.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "lamp/data/datasets.h"

namespace {

// One file per process, rewritten for each input.
const std::string& scratch_path() {
  static const std::string path =
      "/dev/shm/lamp-idx-fuzz-" + std::to_string(::getpid()) + ".idx";
  return path;
}

bool write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return false;
  }
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!write_file(scratch_path(), data, size)) {
    std::abort(); // the harness's own failure, not the reader's
  }
  try {
    const auto tensor = lamp::data::read_idx(scratch_path());
    // A plain (not gzip) file read whole: its data is the file's tail.
    if (size >= 2 && !(data[0] == 0x1f && data[1] == 0x8b)) {
      const auto numel = static_cast<size_t>(tensor.numel());
      if (tensor.scalar_type() != torch::kUInt8 || numel > size ||
          (numel > 0 && std::memcmp(tensor.data_ptr<uint8_t>(),
                                    data + (size - numel), numel) != 0)) {
        std::abort();
      }
    } else {
      (void)tensor.sum();
    }
  } catch (const c10::Error&) {
    // A refusal with a message is what a damaged file should get.
  }
  return 0;
}
