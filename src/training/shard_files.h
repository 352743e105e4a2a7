#pragma once

// The names of a sharded checkpoint's files: written and read by
// trainer_checkpoint.cpp, checked against the file system's name length by
// the trainer's constructor (trainer.cpp); and the reading of one, which
// checkpoint_weights.cpp shares.

#include <ATen/core/ivalue.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lamp {
namespace training {
namespace detail {

// Rank `rank`'s shard file of the checkpoint at `path`, at `step`.
inline std::string shard_path(const std::string& path, int rank, int world,
                              int64_t step) {
  return path + ".rank" + std::to_string(rank) + "-of-" +
         std::to_string(world) + ".step" + std::to_string(step);
}

// The CRC-32 of each of `saved_world` ranks' shard files that the manifest
// `archive` (at `path`) records: entry k for rank k (rank 0's, in the
// manifest itself, and every one of a manifest written before they were
// recorded: -1). Throws when the list is damaged.
std::vector<int64_t> shard_checksums(torch::serialize::InputArchive& archive,
                                     const std::string& path,
                                     int64_t saved_world);

// Reads saved rank `k`'s (of `saved_world`) shard file of the checkpoint at
// `path` into `train_step`, after checking that it is that rank's of this
// checkpoint (`model_name`'s, at `global_step`), and the very file the
// manifest was written with when it records the shards' checksums
// (`checksum` >= 0); returns the file's path. The file is the checkpoint's
// own (shard_path: a copy carries its shards under its own name), else the
// one the manifest names in `entry` (the name it was written under). Throws,
// naming the files, when neither is there or right.
std::string read_shard(const std::string& path, const c10::IValue& entry,
                       int64_t k, int64_t saved_world, int64_t global_step,
                       int64_t checksum, const std::string& model_name,
                       torch::serialize::InputArchive& train_step);

} // namespace detail
} // namespace training
} // namespace lamp
