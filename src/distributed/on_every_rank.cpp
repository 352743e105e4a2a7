#include "distributed/on_every_rank.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>

namespace lamp {
namespace distributed {
namespace detail {

void on_every_rank(ProcessGroup& group, const std::string& what,
                   const std::function<void()>& work) {
  constexpr int64_t kMessageBytes = 1000;
  std::string error;
  try {
    work();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  // Row r: 1 where rank r failed, then its message's bytes (a sum of rows
  // that only rank r fills is an all-gather).
  auto rows =
      torch::zeros({group.world_size(), 1 + kMessageBytes}, torch::kInt);
  if (!error.empty()) {
    auto row = rows[group.rank()];
    row[0] = 1;
    const auto n =
        std::min<int64_t>(kMessageBytes, static_cast<int64_t>(error.size()));
    for (int64_t i = 0; i < n; ++i) {
      row[1 + i] = static_cast<int>(static_cast<unsigned char>(error[i]));
    }
  }
  // On the group's device (NCCL reduces CUDA tensors only), read back here.
  auto reduced = rows.to(group.device());
  group.all_reduce_(reduced, ReduceOp::kSum, "the agreement on " + what);
  TORCH_CHECK(error.empty(), error);
  rows = reduced.cpu();
  const auto a = rows.accessor<int, 2>();
  std::string ranks, first;
  for (int r = 0; r < group.world_size(); ++r) {
    if (a[r][0] == 0) {
      continue;
    }
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!first.empty()) {
      continue;
    }
    for (int64_t i = 1; i <= kMessageBytes && a[r][i] != 0; ++i) {
      first += static_cast<char>(a[r][i]);
    }
    while (!first.empty() && (first.back() == '.' || first.back() == ' ')) {
      first.pop_back(); // the message around it ends the sentence
    }
  }
  TORCH_CHECK(
      ranks.empty(), "lamp: rank ", ranks, " failed in ", what, ": ", first,
      static_cast<int64_t>(first.size()) >= kMessageBytes ? " [...]" : "",
      " (rank ", group.rank(), " stops too).");
}

} // namespace detail
} // namespace distributed
} // namespace lamp
