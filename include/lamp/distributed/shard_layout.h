#pragma once

/// \file
/// How tensors lie in one flat buffer split evenly among ranks: the layout
/// of sharded optimizer state (ZeRO), where each rank keeps and steps one
/// contiguous slice of the flat master weights and optimizer state, the
/// gradients reach it by ProcessGroup::reduce_scatter_() and the weights
/// return by ProcessGroup::all_gather_().

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lamp {
namespace distributed {

/// Tensors of `numels` elements laid end to end in a flat buffer of
/// padded_numel() = world_size x shard_numel() elements: tensor i at
/// [offset(i), offset(i) + numels[i]), then at most world_size - 1 elements
/// of padding (zeros, never a tensor's). Rank r owns the shard
/// [r shard_numel(), (r + 1) shard_numel()). The shards differ by no more
/// than the padding; a tensor may span ranks.
///
/// \code
///   ShardLayout layout({3, 5, 2}, 3); // 10 elements, shards of 4
///   layout.pieces(1);  // {tensor 1, its elements 1..4, shard offset 0}
/// \endcode
class ShardLayout {
 public:
  /// The part of one tensor in one rank's shard.
  struct Piece {
    /// Index into the constructor's numels.
    size_t tensor = 0;
    /// The piece's first element, within the tensor.
    int64_t tensor_offset = 0;
    /// Where the piece starts within the rank's shard.
    int64_t shard_offset = 0;
    /// Elements.
    int64_t length = 0;
    /// All four fields equal.
    bool operator==(const Piece& o) const {
      return tensor == o.tensor && tensor_offset == o.tensor_offset &&
             shard_offset == o.shard_offset && length == o.length;
    }
  };

  /// Throws when `world_size` < 1 or a numel is negative.
  ShardLayout(std::vector<int64_t> numels, int world_size);

  /// The ranks the tensors are split among.
  int world_size() const { return world_size_; }
  /// Elements of all tensors, without padding.
  int64_t numel() const { return numel_; }
  /// Elements of each rank's shard: numel() / world_size() rounded up.
  int64_t shard_numel() const { return shard_numel_; }
  /// world_size() x shard_numel().
  int64_t padded_numel() const { return shard_numel_ * world_size_; }
  /// Tensor i's first element in the flat buffer.
  int64_t offset(size_t i) const { return offsets_.at(i); }
  /// How many tensors the layout holds.
  size_t tensors() const { return numels_.size(); }
  /// The pieces of the tensors that rank `rank` owns, in flat order (the
  /// padding is none of them). Throws for a rank outside the world.
  std::vector<Piece> pieces(int rank) const;

 private:
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
  int world_size_;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
};

} // namespace distributed
} // namespace lamp
