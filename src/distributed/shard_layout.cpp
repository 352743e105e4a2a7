#include "lamp/distributed/shard_layout.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace lamp {
namespace distributed {

ShardLayout::ShardLayout(std::vector<int64_t> numels, int world_size)
    : numels_(std::move(numels)), world_size_(world_size) {
  TORCH_CHECK(world_size_ >= 1,
              "lamp::distributed::ShardLayout: the world "
              "size must be at least 1, not ",
              world_size_, ".");
  offsets_.reserve(numels_.size());
  for (size_t i = 0; i < numels_.size(); ++i) {
    TORCH_CHECK(numels_[i] >= 0, "lamp::distributed::ShardLayout: tensor ", i,
                " has a negative number of elements (", numels_[i], ").");
    offsets_.push_back(numel_);
    numel_ += numels_[i];
  }
  shard_numel_ = (numel_ + world_size_ - 1) / world_size_;
}

std::vector<ShardLayout::Piece> ShardLayout::pieces(int rank) const {
  TORCH_CHECK(rank >= 0 && rank < world_size_,
              "lamp::distributed::ShardLayout::pieces: rank ", rank,
              " is outside world size ", world_size_, ".");
  const int64_t begin = rank * shard_numel_;
  const int64_t end = begin + shard_numel_;
  std::vector<Piece> result;
  // The first tensor that ends after `begin`.
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), begin);
  size_t i = it == offsets_.begin()
                 ? 0
                 : static_cast<size_t>(it - offsets_.begin() - 1);
  for (; i < numels_.size() && offsets_[i] < end; ++i) {
    const int64_t from = std::max(begin, offsets_[i]);
    const int64_t to = std::min(end, offsets_[i] + numels_[i]);
    if (to > from) {
      result.push_back(Piece{i, from - offsets_[i], from - begin, to - from});
    }
  }
  return result;
}

} // namespace distributed
} // namespace lamp
