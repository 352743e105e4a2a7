// A libFuzzer target for lamp's pickle reader (src/platform/plain_pickle.cpp),
// which reads what users hand lamp from Python: meta.pkl, GradScaler states,
// state_dicts and checkpoints. Every input is read three ways (plain values,
// a skeleton with objects as None, tensors from a storage loader), and each
// tensor read is summed, so that a view beyond its storage is a read that
// AddressSanitizer reports. Built and run by scripts/fuzz.sh.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "platform/plain_pickle.h"

namespace {

void touch(const c10::IValue& value, int depth) {
  if (depth > 64) {
    return;
  }
  if (value.isTensor()) {
    (void)value.toTensor().contiguous().sum();
  } else if (value.isTuple()) {
    for (const auto& element : value.toTupleRef().elements()) {
      touch(element, depth + 1);
    }
  } else if (value.isList()) {
    for (const auto& element : value.toListRef()) {
      touch(element, depth + 1);
    }
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      touch(entry.key(), depth + 1);
      touch(entry.value(), depth + 1);
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Storages of up to 4,096 zeros, as the zip's records would give them.
  const lamp::detail::StorageLoader storages =
      [](const std::string&, c10::ScalarType dtype, int64_t numel) {
        TORCH_CHECK(numel >= 0 && numel <= 4096, "numel ", numel);
        return torch::zeros({numel}, dtype);
      };
  for (int way = 0; way < 3; ++way) {
    try {
      const auto value = lamp::detail::read_plain_pickle(
          reinterpret_cast<const char*>(data), size, "fuzz",
          /*objects_as_none=*/way == 1,
          way == 2 ? storages : lamp::detail::StorageLoader{});
      if (value) {
        touch(*value, 0);
      }
    } catch (const c10::Error&) {
      // A refusal with a message is what a damaged file should get.
    }
  }
  return 0;
}
