#pragma once

// The names of a sharded checkpoint's files: written and read by
// trainer_checkpoint.cpp, checked against the file system's name length by
// the trainer's constructor (trainer.cpp).

#include <cstdint>
#include <string>

namespace lamp {
namespace training {
namespace detail {

// Rank `rank`'s shard file of the checkpoint at `path`, at `step`.
inline std::string shard_path(const std::string& path, int rank, int world,
                              int64_t step) {
  return path + ".rank" + std::to_string(rank) + "-of-" +
         std::to_string(world) + ".step" + std::to_string(step);
}

} // namespace detail
} // namespace training
} // namespace lamp
