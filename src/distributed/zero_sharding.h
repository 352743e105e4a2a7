#pragma once

// ZeroSharding: lamp's one implementation of lamp::OptimizerSharding (ZeRO
// stages 1 and 2 over a process group). optimizer_sharding() and
// stage2_sharding() return one; ShardedOptimizer holds one by value.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/shard_buckets.h"
#include "lamp/amp/optimizer_sharding.h"
#include "lamp/distributed/process_group.h"
#include "lamp/distributed/shard_layout.h"

namespace lamp {
namespace distributed {
namespace detail {

/// The bytes of `t`'s elements; 0 for an undefined tensor.
int64_t bytes_of(const torch::Tensor& t);

/// ZeRO stage 1 over a process group: the parameters of each (param group,
/// dtype) pair lie end to end in a ShardLayout, and this rank keeps an FP32
/// shard of each. With a bucket cap, ZeRO stage 2 (stage2_sharding()).
/// ShardedOptimizer and TrainStep (through DataParallel) both use it.
class ZeroSharding final : public OptimizerSharding {
 public:
  /// `cap_bytes` > 0: ZeRO stage 2 (stage2_sharding()).
  explicit ZeroSharding(std::shared_ptr<ProcessGroup> group,
                        int64_t cap_bytes = 0,
                        InstallShardBuckets install = nullptr);

  /// Lays out `params` (param group `groups[i]` for parameter i) and makes
  /// this rank's shards, one per (group, dtype) in order of appearance.
  void build(std::vector<torch::Tensor> params,
             const std::vector<size_t>& groups,
             const std::vector<std::string>& names);

  void shard(torch::optim::Optimizer& optimizer,
             const std::vector<torch::Tensor>& params,
             const std::vector<std::string>& names) override;

  const std::vector<torch::Tensor>& shards() const override { return shards_; }
  const std::vector<std::string>& shard_names() const override {
    return shard_names_;
  }

  void gradients_to_shards() override;
  void shards_to_parameters() override;
  std::vector<torch::Tensor> gather_masters() override;
  void set_masters(const std::vector<torch::Tensor>& values) override;
  void reduce_square_sum(torch::Tensor& square_sum) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void check(torch::serialize::InputArchive& archive,
             const std::string& where) const override;
  void load(torch::serialize::InputArchive& archive) override;
  void agree(const std::string& what,
             const std::function<void()>& work) override;
  void reshard(std::vector<torch::serialize::InputArchive>& shards,
               std::vector<torch::serialize::InputArchive>& optimizers,
               torch::serialize::OutputArchive& shard_out,
               torch::serialize::OutputArchive& optimizer_out,
               const std::string& where) const override;

  /// Stage 2: each (param group, dtype) unit cut into runs of at most
  /// cap_bytes_ (a parameter larger than that alone), from its last
  /// parameter back, as DataParallel's buckets are; each run is a unit.
  void split_into_runs();

  /// Stage 2's buckets: one per unit, the units whose parameters come last
  /// in the model (whose gradients the backward makes first) first.
  std::vector<ShardBucket> shard_buckets();

  /// Bytes of this rank's FP32 shards and their gradients.
  int64_t bytes() const;
  /// The layout of each unit, in the order of shards().
  const std::vector<ShardLayout> layouts() const;

 private:
  /// The parameters of one dtype in one param group.
  struct Unit {
    size_t group = 0;
    torch::Dtype dtype = torch::kFloat;
    std::vector<size_t> members; // indices into params_
    std::unique_ptr<ShardLayout> layout;
    std::vector<ShardLayout::Piece> mine;
    // The gathered weights in the parameters' dtype (padded), and this
    // rank's part of them before the gather.
    torch::Tensor flat;
    torch::Tensor outgoing;
  };

  /// Per unit: its group, its dtype's code and its members' sizes, as one
  /// int64 tensor [group, dtype, count, numel...] after another.
  torch::Tensor layout_tensor() const;

  std::shared_ptr<ProcessGroup> group_;
  int64_t cap_bytes_ = 0; // > 0: stage 2
  InstallShardBuckets install_;
  // shard()'s parameters, and each of params_'s index among them.
  std::vector<torch::Tensor> given_;
  std::vector<size_t> given_index_;
  std::vector<torch::Tensor> params_;
  // Each of params_'s name in the model, unquoted (shard()'s only): saved
  // with the shards, so that the masters can be read back whole by name
  // (gather_saved_masters).
  std::vector<std::string> model_names_;
  std::vector<Unit> units_;
  size_t group_count_ = 0;            // the optimizer's param groups
  std::vector<torch::Tensor> shards_; // FP32, one per unit
  std::vector<std::string> shard_names_;
};

} // namespace detail
} // namespace distributed
} // namespace lamp
