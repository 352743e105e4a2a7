#pragma once

// Token ids in and out of lamp's tokenizers (internal): the check of the
// ids a decode() takes, and the tensor an encode() gives.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace lamp {
namespace data {
namespace internal {

// `ids` (integers [n], any integer type, on any device) as int64 on the
// CPU, contiguous; refused naming `caller` otherwise.
inline torch::Tensor token_ids_on_cpu(const torch::Tensor& ids,
                                      const char* caller) {
  TORCH_CHECK(ids.dim() == 1 && !ids.is_floating_point() && !ids.is_complex() &&
                  ids.scalar_type() != torch::kBool,
              caller, ": ids must be integers [n], got ", ids.scalar_type(),
              " ", ids.sizes(), ".");
  return ids.to(torch::kCPU, torch::kLong).contiguous();
}

// `ids` as int64 [n] on the CPU.
template <typename Id>
torch::Tensor token_ids_tensor(const std::vector<Id>& ids) {
  auto out = torch::empty({static_cast<int64_t>(ids.size())}, torch::kLong);
  std::copy(ids.begin(), ids.end(), out.data_ptr<int64_t>());
  return out;
}

} // namespace internal
} // namespace data
} // namespace lamp
