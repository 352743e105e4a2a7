#include "distributed/on_every_rank.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <exception>

namespace lamp {
namespace distributed {
namespace detail {

void on_every_rank(ProcessGroup& group, const std::string& what,
                   const std::function<void()>& work) {
  constexpr int64_t kMessageBytes = 1000;
  std::string error;
  // Any exception, not c10::Error alone: a rank that left here without the
  // all-reduce (std::bad_alloc, a std::runtime_error from a user's
  // OptimizerSharding::agree work) would leave the others waiting in it
  // until the group's timeout. This rank rethrows it as it was.
  std::exception_ptr thrown;
  bool failed = true;
  try {
    work();
    failed = false;
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    thrown = std::current_exception();
    error = e.what();
  } catch (...) {
    thrown = std::current_exception();
    error = "an exception that is not a std::exception";
  }
  if (failed && error.empty()) {
    error = "an exception without a message";
  }
  // Row r: 1 where rank r failed, then its message's bytes (a sum of rows
  // that only rank r fills is an all-gather).
  auto rows =
      torch::zeros({group.world_size(), 1 + kMessageBytes}, torch::kInt);
  if (failed) {
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
  if (thrown) {
    std::rethrow_exception(thrown);
  }
  TORCH_CHECK(!failed, error);
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

void ProcessGroup::agree(const std::string& what,
                         const std::function<void()>& work) {
  detail::on_every_rank(*this, what, work);
}

} // namespace distributed
} // namespace lamp
