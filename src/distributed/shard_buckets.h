#pragma once

// ZeRO stage 2 between the sharding and DataParallel: the sharding lays the
// parameters out in runs of at most the bucket cap, each its own shard, and
// DataParallel reduce-scatters each run's gradients straight into this
// rank's shard gradient as the backward fills it.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lamp/amp/optimizer_sharding.h"

namespace lamp {
namespace distributed {

class ProcessGroup;

namespace detail {

/// One run of parameters laid end to end: the gradients of `params` go at
/// `offsets` in a flat buffer of `padded_numel` elements of `dtype`, whose
/// reduce-scatter gives this rank `shard_numel` elements for `shard_grad`
/// (FP32).
struct ShardBucket {
  std::vector<torch::Tensor> params;
  std::vector<int64_t> offsets;
  int64_t padded_numel = 0;
  int64_t shard_numel = 0;
  torch::Dtype dtype = torch::kFloat;
  torch::Tensor shard_grad;
};

/// Receives the runs, in the order their reduce-scatters start (the last
/// parameters first: the backward makes their gradients first).
using InstallShardBuckets = std::function<void(std::vector<ShardBucket>)>;

/// ZeRO stage 2 over `group`: as optimizer_sharding(), with the parameters
/// of each (param group, dtype) split into runs of at most `cap_bytes`
/// (each its own shard), handed to `install` by shard(). The gradients then
/// reach the shards without gradients_to_shards(), which does nothing.
std::unique_ptr<OptimizerSharding> stage2_sharding(
    std::shared_ptr<ProcessGroup> group, int64_t cap_bytes,
    InstallShardBuckets install);

} // namespace detail
} // namespace distributed
} // namespace lamp
