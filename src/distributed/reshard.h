#pragma once

// Re-sharding ZeRO state saved by N ranks for a run over another number:
// the flat arithmetic, and the optimizer archives in torch::optim's layout.

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lamp {
namespace distributed {
namespace detail {

/// One shard's elements before and after: the unit's `numel` elements
/// (without padding), `old_shard` per rank in the saved run and
/// `new_shard` per rank now.
struct ReshardSizes {
  int64_t numel = 0;
  int64_t old_shard = 0;
  int64_t new_shard = 0;
};

/// Rank `rank`'s shard of `sizes.new_shard` elements, cut from the saved
/// ranks' shards of one unit (in rank order, `sizes.old_shard` each) laid
/// end to end; its padding is zeros.
torch::Tensor reshard_flat(const std::vector<torch::Tensor>& saved,
                           const ReshardSizes& sizes, int rank);

/// Writes into `out` the optimizer archive of rank `rank` from the saved
/// ranks' `optimizers` (torch::optim's layout): the param groups and
/// options of rank 0's, and per shard (`groups[g][i]`: the sizes of param
/// group g's shard i) each state tensor of old_shard elements re-sharded;
/// every other state value must be the same in every archive. Throws,
/// naming `where`, on another layout or a disagreement.
void reshard_optimizer(std::vector<torch::serialize::InputArchive>& optimizers,
                       const std::vector<std::vector<ReshardSizes>>& groups,
                       int rank, torch::serialize::OutputArchive& out,
                       const std::string& where);

/// The FP32 master weights that the saved ranks' shard archives hold
/// (ZeroSharding::save's, every saved rank's in rank order), put back
/// together: each trainable parameter's by its name in the model, flat, in
/// the order the shards lay them out. Empty when the archives do not name
/// their parameters (written before they did). Throws, naming `where`, when
/// the archives are not one run's ranks or their shards are damaged.
std::vector<std::pair<std::string, torch::Tensor>> gather_saved_masters(
    std::vector<torch::serialize::InputArchive>& shards,
    const std::string& where);

} // namespace detail
} // namespace distributed
} // namespace lamp
