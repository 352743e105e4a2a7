#pragma once

// The sharded optimizer state of every rank put together, for the ZeRO
// tests of TrainStep (zero_steps.cpp) and ShardedOptimizer
// (dist_worker.cpp): what moved bit for bit when a checkpoint moves between
// numbers of ranks, and what a refused load must leave as it was.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "lamp/distributed/process_group.h"
#include "platform/compat.h"
#include "test_util.h"

namespace lamp_test {

/// Per shard of `optimizer` (an AdamW stepping this rank's FP32 shards):
/// the master weights, the two moments (gathered over `g`, padding
/// included) and the step count.
inline std::vector<torch::Tensor> gathered_state(
    torch::optim::Optimizer& optimizer, lamp::distributed::ProcessGroup& g) {
  std::vector<torch::Tensor> out;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const auto& state = static_cast<torch::optim::AdamWParamState&>(
          *optimizer.state().at(lamp::detail::optimizer_state_key(p)));
      for (const auto& t : std::vector<torch::Tensor>{
               p.detach(), state.exp_avg(), state.exp_avg_sq()}) {
        auto flat = torch::empty({t.numel() * g.world_size()}, t.options());
        g.all_gather_(flat, t.contiguous());
        out.push_back(flat);
      }
      out.push_back(torch::full({1}, state.step(), torch::kLong));
    }
  }
  return out;
}

/// The same state, whatever the padding: equal bit for bit over the
/// shorter length, zeros beyond it.
inline void expect_same_state(const std::vector<torch::Tensor>& a,
                              const std::vector<torch::Tensor>& b,
                              const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto n = std::min(a[i].numel(), b[i].numel());
    EXPECT_TRUE(BitEqual(a[i].narrow(0, 0, n), b[i].narrow(0, 0, n)))
        << what << ": tensor " << i;
    for (const auto& t : {a[i], b[i]}) {
      EXPECT_EQ(t.narrow(0, n, t.numel() - n).count_nonzero().item<int64_t>(),
                0)
          << what << ": padding of tensor " << i;
    }
  }
}

} // namespace lamp_test
