// Trainer's checkpoints: what save_checkpoint() writes and
// load_checkpoint() checks and restores (the run's settings are listed in
// run_settings.cpp).
#include "lamp/training/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "distributed/on_every_rank.h"
#include "lamp/platform/checkpoint_file.h"
#include "platform/archive.h"
#include "platform/paths.h"
#include "training/divergence_watch.h"
#include "training/epoch_run.h"
#include "training/run_settings.h"
#include "training/shard_files.h"

namespace lamp {
namespace training {
namespace {

using detail::kCheckpointFormat;
using distributed::detail::on_every_rank;

// Anything at `path` (data/files.h: POSIX, not std::filesystem).
bool exists(const std::string& path) {
  return lamp::detail::path_kind(path) != lamp::detail::PathKind::kMissing;
}

// The format of a rank's shard file of a sharded checkpoint.
constexpr const char* kShardFormat = "lamp-classifier-trainer-shard-1";

// Whether `text` from `at` is one or more digits and then `then` ("" for
// the end); moves `at` past them.
bool digits_then(const std::string& text, size_t& at, const std::string& then) {
  const size_t start = at;
  while (at < text.size() && text[at] >= '0' && text[at] <= '9') {
    ++at;
  }
  if (at == start || text.compare(at, then.size(), then) != 0) {
    return false;
  }
  at += then.size();
  return then.empty() ? at == text.size() : true;
}

// Removes the shard files beside `path` (detail::shard_path's names: any
// rank, world size and step) that are not in `keep` (base names): those of
// checkpoints earlier runs wrote under this name, at another world size or
// step, which no manifest at `path` names once the new one is written. A
// run started afresh over a sharded checkpoint left them for good before.
// A file another rank removed first is no error.
void remove_other_shards(const std::string& path,
                         const std::vector<std::string>& keep) {
  const std::string prefix = lamp::detail::base_name(path) + ".rank";
  const std::string folder = lamp::detail::parent_folder(path);
  for (const auto& name : lamp::detail::folder_names(folder)) {
    size_t at = prefix.size();
    const bool shard = name.compare(0, prefix.size(), prefix) == 0 &&
                       digits_then(name, at, "-of-") &&
                       digits_then(name, at, ".step") &&
                       digits_then(name, at, "");
    if (shard && std::find(keep.begin(), keep.end(), name) == keep.end()) {
      ::unlink(lamp::detail::join_path(folder, name).c_str());
    }
  }
}

} // namespace

std::array<double, 4> Trainer::local_sums() const {
  const int64_t batches = train_loader_.batches_per_epoch();
  double epoch_loss_sum = resumed_loss_sum_;
  int64_t epoch_non_finite = resumed_non_finite_;
  double interval_loss_sum = resumed_interval_loss_sum_;
  int64_t interval_non_finite = resumed_interval_non_finite_;
  if (active_run_ != nullptr) {
    epoch_loss_sum = active_run_->loss_sum.item<double>();
    epoch_non_finite = active_run_->non_finite();
    // Counted only where there are evaluations inside the run.
    if (options_.eval_every() > 0 && interval_loss_sum_.defined()) {
      interval_loss_sum = interval_loss_sum_.item<double>();
      interval_non_finite = active_run_->watch->read_non_finite_losses() -
                            interval_non_finite_before_;
    }
  }
  if (start_step_in_epoch_ % batches == 0) { // an epoch's start: none yet
    epoch_loss_sum = 0;
    epoch_non_finite = 0;
  }
  return {epoch_loss_sum, static_cast<double>(epoch_non_finite),
          interval_loss_sum, static_cast<double>(interval_non_finite)};
}

void Trainer::gather_rank_sums() {
  const auto& group = options_.process_group();
  if (!group || !group->is_distributed()) {
    return; // save_checkpoint() reads this process's own
  }
  const auto mine = local_sums();
  auto rows = torch::zeros({group->world_size(), 4}, torch::kDouble);
  for (int k = 0; k < 4; ++k) {
    rows[group->rank()][k] = mine[static_cast<size_t>(k)];
  }
  // Gathered on the group's device (NCCL takes no CPU tensor).
  auto gathered = rows.to(group->device());
  group->all_reduce_(gathered, distributed::ReduceOp::kSum,
                     "the gathering of the ranks' loss sums for the "
                     "checkpoint");
  rank_sums_ = gathered.cpu();
  rank_sums_step_ = global_step_;
}

void Trainer::save_checkpoint(const std::string& path) const {
  // A diverged model never replaces a good checkpoint.
  const auto bad = detail::first_non_finite(*model_);
  TORCH_CHECK(
      bad.empty(), "lamp: not writing the checkpoint ", path, ": ", bad,
      " has inf/NaN values; the previous checkpoint was left as it was.");
  const auto& o = options_;
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kCheckpointFormat)));
  archive.write("model_name", c10::IValue(model_name_));
  // The settings a resumed run must repeat to continue the same run.
  detail::write_run_settings(
      archive, {o, train_loader_.options(), train_data_, test_data_});
  archive.write("train_images", c10::IValue(train_loader_.size()));
  archive.write("steps_per_epoch",
                c10::IValue(train_loader_.batches_per_epoch()));
  // The position: the epoch in progress and its steps done (0 after a
  // whole epoch), with the sums of that epoch's losses so far, so that a
  // resume inside it reports the straight run's loss; and those since the
  // last evaluation (eval_every), so that the next one covers the straight
  // run's steps.
  const int64_t batches = train_loader_.batches_per_epoch();
  int64_t next_epoch = start_epoch_;
  int64_t epoch_step = start_step_in_epoch_;
  if (epoch_step >= batches) { // trained whole, not yet ended
    ++next_epoch;
    epoch_step = 0;
  }
  // Every rank's sums where the ranks gathered them for this step (every
  // rank resumes its own), else this process's.
  const auto& ranks = o.process_group();
  torch::Tensor sums;
  if (ranks && ranks->is_distributed() && rank_sums_step_ == global_step_) {
    sums = rank_sums_;
  } else {
    const auto mine = local_sums();
    sums = torch::tensor({mine[0], mine[1], mine[2], mine[3]}, torch::kDouble)
               .reshape({1, 4});
  }
  archive.write("next_epoch", c10::IValue(next_epoch));
  archive.write("epoch_step", c10::IValue(epoch_step));
  // Rank 0's, as lamp 0.5's checkpoints before the ranks' sums.
  archive.write("epoch_loss_sum", c10::IValue(sums[0][0].item<double>()));
  archive.write("epoch_non_finite",
                c10::IValue(static_cast<int64_t>(sums[0][1].item<double>())));
  archive.write("rank_sums", sums);
  archive.write("interval_steps",
                c10::IValue(active_run_ != nullptr ? interval_steps_
                                                   : resumed_interval_steps_));
  archive.write("evaluation_pending", c10::IValue(evaluation_pending_));
  archive.write("best_test_loss", c10::IValue(best_test_loss_));
  archive.write("best_test_examples", c10::IValue(best_test_examples_));
  archive.write("global_step", c10::IValue(global_step_));
  detail::write_history(archive, history_);
  detail::write_program_settings(archive, o.program_settings());
  // The data order and augmentation come from (seed, epoch); the global CPU
  // generator (weight init, dropout in users' models) is saved as well.
  archive.write("cpu_rng_state",
                at::detail::getDefaultCPUGenerator().get_state());
  const auto device = train_loader_.device();
  if (device.is_cuda()) {
    // Dropout on a GPU draws from the device's generator.
    auto generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    archive.write("cuda_rng_state", generator.get_state());
  }
  torch::serialize::OutputArchive step_archive;
  step_->save(step_archive);
  const auto& group = o.process_group();
  // The first write of this run's checkpoint removes the shard files that
  // earlier runs (another world size, another step) left under its name.
  const bool first_write = !checkpoint_written_before_ &&
                           lamp::detail::same_file(path, options_.checkpoint());
  if (step_->optimizer_sharding() == nullptr || !group) {
    archive.write("train_step", step_archive);
    save_checked_archive(archive, path);
    if (first_write) {
      remove_other_shards(path, {});
      checkpoint_written_before_ = true;
    }
    return;
  }
  // Sharded: the other ranks' shard files first, then rank 0's manifest
  // naming them, then the previous shard files go. A run stopped anywhere
  // leaves the previous manifest with its files, or the new one with its.
  const int rank = group->rank();
  const int world = group->world_size();
  const auto mine = detail::shard_path(path, rank, world, global_step_);
  // Each shard's checksum, recorded in the manifest: a shard file that
  // another run (or a later step) has written since is refused on resume.
  // Gathered on the group's device (NCCL's collectives take no CPU tensor),
  // written into on the CPU.
  auto checksums = torch::zeros({world}, torch::kLong);
  on_every_rank(*group, "writing the checkpoint's shards", [&] {
    if (rank == 0) {
      return;
    }
    torch::serialize::OutputArchive shard;
    shard.write("format", c10::IValue(std::string(kShardFormat)));
    shard.write("model_name", c10::IValue(model_name_));
    shard.write("rank", c10::IValue(int64_t{rank}));
    shard.write("world_size", c10::IValue(int64_t{world}));
    shard.write("global_step", c10::IValue(global_step_));
    shard.write("train_step", step_archive);
    checksums[rank] = static_cast<int64_t>(save_checked_archive(shard, mine));
  });
  auto gathered = checksums.to(group->device());
  group->all_reduce_(gathered, distributed::ReduceOp::kSum,
                     "the gathering of the shards' checksums");
  checksums = gathered.cpu();
  on_every_rank(*group, "writing the checkpoint's manifest", [&] {
    if (rank != 0) {
      return;
    }
    c10::List<std::string> shards;
    for (int r = 1; r < world; ++r) {
      shards.push_back(lamp::detail::base_name(
          detail::shard_path(path, r, world, global_step_)));
    }
    archive.write("zero_shards", c10::IValue(shards));
    archive.write("zero_shard_crc32", checksums.narrow(0, 1, world - 1));
    archive.write("train_step", step_archive);
    save_checked_archive(archive, path);
  });
  for (const auto& previous : previous_shards_) {
    if (previous != mine) {
      std::remove(previous.c_str()); // the manifest no longer names it
    }
  }
  if (first_write) {
    std::vector<std::string> ours;
    for (int r = 1; r < world; ++r) {
      ours.push_back(lamp::detail::base_name(
          detail::shard_path(path, r, world, global_step_)));
    }
    remove_other_shards(path, ours);
    checkpoint_written_before_ = true;
  }
  previous_shards_.clear();
  if (rank > 0) {
    previous_shards_.push_back(mine);
  }
}

namespace {

// What a shard file says it holds, for a message: ", the shard of rank 1
// of 2 at step 4", or "" when it does not say.
std::string shard_description(torch::serialize::InputArchive& shard) {
  c10::IValue rank, world, step;
  if (!shard.try_read("rank", rank) || !shard.try_read("world_size", world) ||
      !shard.try_read("global_step", step) || !rank.isInt() || !world.isInt() ||
      !step.isInt()) {
    return "";
  }
  return ", the shard of rank " + std::to_string(rank.toInt()) + " of " +
         std::to_string(world.toInt()) + " at step " +
         std::to_string(step.toInt());
}

} // namespace

std::vector<int64_t> detail::shard_checksums(
    torch::serialize::InputArchive& archive, const std::string& path,
    int64_t saved_world) {
  std::vector<int64_t> checksums(saved_world, -1);
  torch::Tensor recorded;
  if (archive.try_read("zero_shard_crc32", recorded)) {
    TORCH_CHECK(recorded.scalar_type() == torch::kLong && recorded.dim() == 1 &&
                    recorded.size(0) == saved_world - 1,
                "lamp: ", path,
                ": the manifest's list of shard checksums is damaged.");
    for (int64_t k = 1; k < saved_world; ++k) {
      checksums[k] = recorded[k - 1].item<int64_t>();
    }
  }
  return checksums;
}

std::string detail::read_shard(const std::string& path,
                               const c10::IValue& entry, int64_t k,
                               int64_t saved_world, int64_t global_step,
                               int64_t checksum, const std::string& model_name,
                               torch::serialize::InputArchive& train_step) {
  TORCH_CHECK(entry.isString(), "lamp: ", path,
              ": the manifest's list of shard files is damaged.");
  const auto own = detail::shard_path(
      path, static_cast<int>(k), static_cast<int>(saved_world), global_step);
  const auto named = lamp::detail::join_path(lamp::detail::parent_folder(path),
                                             entry.toStringRef());
  std::vector<std::string> candidates{own};
  if (named != own) {
    candidates.push_back(named);
  }
  std::string file, others;
  torch::serialize::InputArchive shard;
  for (const auto& candidate : candidates) {
    if (!exists(candidate)) {
      continue;
    }
    torch::serialize::InputArchive read;
    const uint32_t crc = load_checked_archive(read, candidate);
    if (checksum >= 0 && static_cast<int64_t>(crc) != checksum) {
      others += (others.empty() ? "" : "; ") + candidate + " (CRC-32 " +
                std::to_string(crc) + shard_description(read) + ")";
      continue;
    }
    file = candidate;
    shard = std::move(read);
    break;
  }
  TORCH_CHECK(
      !file.empty() || !others.empty(), "lamp: ", path, " needs rank ", k,
      "'s shard of the optimizer state in ", own,
      named != own ? " (or " + named + ", the name it was written under)"
                   : std::string(),
      ", which is missing; copy a checkpoint with all its .rank* files, "
      "renamed with it (",
      lamp::detail::base_name(own),
      " beside the copy), or resume from another checkpoint.");
  TORCH_CHECK(!file.empty(), "lamp: ", path, " was written with rank ", k,
              "'s shard of CRC-32 ", checksum,
              ", but the shard files there "
              "are others: ",
              others,
              ". Another run, or a later checkpoint, has written them since "
              "(a copy of a checkpoint without its own shard files reads the "
              "original's). Copy a checkpoint together with its .rank* files, "
              "renamed with it, or resume from another checkpoint.");
  const std::string shard_where = "lamp: " + file;
  const auto* w = shard_where.c_str();
  const auto format = lamp::detail::read_string(shard, "format", w);
  TORCH_CHECK(format == kShardFormat, "lamp: ", file, " is a '", format,
              "' file, not a shard of lamp's trainer ('", kShardFormat, "').");
  const auto their_rank = lamp::detail::read_int(shard, "rank", w);
  const auto their_world = lamp::detail::read_int(shard, "world_size", w);
  const auto their_step = lamp::detail::read_int(shard, "global_step", w);
  const auto their_model = lamp::detail::read_string(shard, "model_name", w);
  TORCH_CHECK(their_rank == k && their_world == saved_world &&
                  their_step == global_step && their_model == model_name,
              "lamp: ", file, " holds the shard of rank ", their_rank, " of ",
              their_world, " at step ", their_step, " of a '", their_model,
              "' model, but ", path, " needs rank ", k, " of ", saved_world,
              " at step ", global_step, " of a '", model_name,
              "' model; the shard files were mixed up (copied from another "
              "checkpoint or renamed).");
  lamp::detail::read_archive(shard, "train_step", train_step, w);
  return file;
}

void Trainer::load_checkpoint(const std::string& path) {
  torch::serialize::InputArchive archive;
  const auto read = [&] {
    TORCH_CHECK(exists(path), "lamp: no checkpoint at ", path,
                " to resume from.");
    load_checked_archive(archive, path);
  };
  // Each rank reads its own copy (a node's disk): one that is missing or
  // damaged stops every rank now, not the others in the comparison of the
  // ranks' checkpoints below until the group's timeout.
  on_every_rank(options_.process_group(), "reading its copy of the checkpoint",
                read);
  // Everything is read and checked before anything of this run changes.
  const std::string where = "lamp: " + path;
  const auto integer = [&](const char* key) {
    return lamp::detail::read_int(archive, key, where.c_str());
  };
  const auto format =
      lamp::detail::read_string(archive, "format", where.c_str());
  TORCH_CHECK(format == kCheckpointFormat, "lamp: ", path, " is a '", format,
              "' checkpoint, not one of lamp's trainer ('", kCheckpointFormat,
              "').");
  const auto model_name =
      lamp::detail::read_string(archive, "model_name", where.c_str());
  const auto& o = options_;
  TORCH_CHECK(model_name == model_name_, "lamp: ", path, " holds a '",
              model_name, "' model but this run trains '", model_name_,
              "'; resume with the same ", name_option(o, "model", "model name"),
              ".");
  // The key keeps lamp 0.4's name: it counts examples, images or sequences.
  const auto train_examples = integer("train_images");
  const auto noun = o.task().example() + "s";
  TORCH_CHECK(train_examples == train_loader_.size(), "lamp: ", path,
              " was trained on ", train_examples, " training ", noun,
              " but this run's dataset has ", train_loader_.size(),
              "; resume with the same ",
              name_option(o, "data", "training dataset"), ".");
  const int64_t checkpoint_epochs = detail::check_run_settings(
      archive, path, {o, train_loader_.options(), train_data_, test_data_});
  auto history = detail::read_history(archive, path);
  const int64_t batches = train_loader_.batches_per_epoch();
  const auto& group = o.process_group();
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->world_size() : 1;
  // The data shards (ranks) it was trained on (checkpoints before
  // num_shards was stored: this run's); check_run_settings refused another
  // number without reshard.
  const int64_t shards_now = train_loader_.options().num_shards();
  c10::IValue stored_shards;
  const int64_t saved_shards = archive.try_read("num_shards", stored_shards)
                                   ? integer("num_shards")
                                   : shards_now;
  const bool resharding = saved_shards != shards_now;
  const auto steps_per_epoch = integer("steps_per_epoch");
  TORCH_CHECK(resharding || steps_per_epoch == batches, "lamp: ", path,
              " was trained with ", steps_per_epoch,
              " steps per epoch but this run has ", batches, " (another ",
              name_option(o, "drop_last", "LoaderOptions::drop_last"),
              " or number of ranks); resume with the same settings.");
  // The position: the epoch in progress and its steps done (checkpoints
  // written before they could be written inside an epoch: 0).
  const auto next_epoch = integer("next_epoch");
  const auto global_step = integer("global_step");
  c10::IValue present;
  const bool inside = archive.try_read("epoch_step", present);
  const int64_t epoch_step = inside ? integer("epoch_step") : 0;
  const double epoch_loss_sum =
      inside
          ? lamp::detail::read_number(archive, "epoch_loss_sum", where.c_str())
          : 0.0;
  const int64_t epoch_non_finite = inside ? integer("epoch_non_finite") : 0;
  const double best_test_loss =
      archive.try_read("best_test_loss", present)
          ? lamp::detail::read_number(archive, "best_test_loss", where.c_str())
          : std::numeric_limits<double>::infinity();
  // Written since lamp 0.5; before, the subset is unknown (0).
  const int64_t best_test_examples =
      archive.try_read("best_test_examples", present)
          ? integer("best_test_examples")
          : 0;
  // The steps the position stands for, next_epoch * steps_per_epoch +
  // epoch_step, or -1 where a damaged checkpoint's counts are negative or
  // their product overflows int64.
  const bool counts = steps_per_epoch >= 1 && next_epoch >= 0 &&
                      epoch_step >= 0 && epoch_step < steps_per_epoch;
  constexpr int64_t kMost = std::numeric_limits<int64_t>::max();
  const bool fits =
      counts && next_epoch <= (kMost - epoch_step) / steps_per_epoch;
  const int64_t steps_reached =
      fits ? next_epoch * steps_per_epoch + epoch_step : -1;
  TORCH_CHECK(steps_reached >= 1 &&
                  (next_epoch < checkpoint_epochs ||
                   (next_epoch == checkpoint_epochs && epoch_step == 0)) &&
                  global_step == steps_reached && epoch_non_finite >= 0 &&
                  epoch_non_finite <= epoch_step &&
                  std::isfinite(epoch_loss_sum) && !std::isnan(best_test_loss),
              "lamp: ", path, " is at epoch ", next_epoch, ", step ",
              global_step, " (", epoch_step,
              " into the epoch), which a run of ", checkpoint_epochs,
              " epochs of ", steps_per_epoch,
              " steps cannot reach; the checkpoint is damaged.");
  TORCH_CHECK(epoch_step == 0 || !resharding, "lamp: ", path, " was written ",
              epoch_step, " steps into epoch ", next_epoch + 1,
              ", and a resume on another number of ranks splits the data "
              "anew from an epoch's start; resume it on the ranks it had "
              "until the epoch ends (or another whole-epoch checkpoint), then "
              "reshard.");
  // Written after lamp 0.5.0: the steps since the last evaluation, whether
  // a stop interrupted the one at this step, and each rank's sums (its
  // epoch's and its interval's finite losses and non-finite ones). Before:
  // none of them; every rank then takes rank 0's epoch sums.
  const int64_t interval_steps = archive.try_read("interval_steps", present)
                                     ? integer("interval_steps")
                                     : 0;
  bool evaluation_pending = false;
  if (archive.try_read("evaluation_pending", present)) {
    TORCH_CHECK(present.isBool(), "lamp: ", path,
                ": 'evaluation_pending' is not a boolean; the checkpoint is "
                "damaged.");
    evaluation_pending = present.toBool();
  }
  TORCH_CHECK(interval_steps >= 0 && interval_steps <= global_step,
              "lamp: ", path, " holds ", interval_steps,
              " steps since its last "
              "evaluation, at step ",
              global_step, "; the checkpoint is damaged.");
  std::array<double, 4> own = {epoch_loss_sum,
                               static_cast<double>(epoch_non_finite), 0.0, 0.0};
  torch::Tensor rank_sums;
  if (archive.try_read("rank_sums", rank_sums)) {
    const bool shaped = rank_sums.scalar_type() == torch::kDouble &&
                        rank_sums.dim() == 2 && rank_sums.size(0) >= 1 &&
                        rank_sums.size(1) == 4;
    bool sound = shaped && torch::isfinite(rank_sums).all().item<bool>();
    if (sound) {
      const auto counts =
          rank_sums.index({torch::indexing::Slice(), torch::tensor({1, 3})});
      const auto limits = torch::tensor({static_cast<double>(epoch_step),
                                         static_cast<double>(interval_steps)},
                                        torch::kDouble);
      sound = counts.eq(counts.round()).all().item<bool>() &&
              counts.ge(0).all().item<bool>() &&
              counts.le(limits).all().item<bool>();
    }
    TORCH_CHECK(sound, "lamp: ", path, ": the ranks' loss sums ('rank_sums', ",
                rank_sums.sizes(), ") are not finite sums and counts within ",
                "the steps; the checkpoint is damaged.");
    // The ranks it was written by: each takes its own. On another number
    // of ranks (a reshard, at an epoch's start): none, and the first
    // evaluation covers the steps from here.
    if (rank_sums.size(0) == world) {
      for (int k = 0; k < 4; ++k) {
        own[static_cast<size_t>(k)] = rank_sums[rank][k].item<double>();
      }
    }
  }
  const bool own_interval = rank_sums.defined() && rank_sums.size(0) == world;
  const auto& stored_program = detail::read_program_settings(archive, path);
  detail::check_program_settings(stored_program, o.program_settings(), path);
  torch::Tensor rng_state;
  try {
    archive.read("cpu_rng_state", rng_state);
    // On a scratch generator first: a bad state must not half-change ours.
    at::detail::createCPUGenerator().set_state(rng_state);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "lamp: ", path,
                ": the saved random number generator state is damaged (",
                e.what_without_backtrace(), ").");
  }
  torch::Tensor cuda_rng_state;
  // Written by a run on a GPU (none before lamp 0.5, nor on a CPU): a run
  // resumed on a GPU from one without goes on from its seed's state. Tried
  // on a copy of the generator first, as the CPU's.
  if (train_loader_.device().is_cuda() &&
      archive.try_read("cuda_rng_state", cuda_rng_state)) {
    try {
      at::globalContext()
          .defaultGenerator(train_loader_.device())
          .clone()
          .set_state(cuda_rng_state);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "lamp: ", path,
                  ": the saved CUDA random number generator state is damaged (",
                  e.what_without_backtrace(), ").");
    }
  }
  torch::serialize::InputArchive step_archive;
  lamp::detail::read_archive(archive, "train_step", step_archive,
                             where.c_str());
  c10::IValue shards;
  const bool sharded = archive.try_read("zero_shards", shards);
  // check_run_settings compared zero_stage; a checkpoint of one rank's
  // shard on a whole run would be refused by TrainStep::load too, but
  // without naming the files.
  TORCH_CHECK(sharded == (step_->optimizer_sharding() != nullptr && group),
              "lamp: ", path, sharded ? " holds" : " does not hold",
              " optimizer state sharded over the ranks, but this run ",
              sharded ? "keeps it whole" : "shards it",
              "; resume with the same ",
              name_option(o, "zero_stage", "TrainerOptions::zero_stage"), ".");
  // Sharded: saved rank k's train_step (the manifest's own for k = 0), for
  // this rank or, re-sharding, for every saved rank.
  const int64_t saved_world =
      sharded && shards.isList()
          ? static_cast<int64_t>(shards.toListRef().size()) + 1
          : world;
  const bool moved = saved_world != world; // the optimizer state
  const auto checksums =
      sharded ? detail::shard_checksums(archive, path, saved_world)
              : std::vector<int64_t>();
  std::vector<torch::serialize::InputArchive> saved;
  std::vector<std::string> files(saved_world);
  if (sharded) {
    saved.resize(moved ? saved_world : 1);
    on_every_rank(*group, "reading the checkpoint's shards", [&] {
      TORCH_CHECK(shards.isList(), "lamp: ", path,
                  ": the manifest's list of shard files is damaged.");
      TORCH_CHECK(!moved || o.reshard(), "lamp: ", path,
                  ": the optimizer state is sharded over ", saved_world,
                  " ranks but this run has ", world, "; resume with ",
                  saved_world, " ranks or with ",
                  name_option(o, "reshard", "TrainerOptions::reshard"), ".");
      for (int64_t k = moved ? 0 : rank; k < saved_world; ++k) {
        auto& into = saved[moved ? k : 0];
        if (k == 0) {
          lamp::detail::read_archive(archive, "train_step", into,
                                     where.c_str());
        } else {
          files[k] = detail::read_shard(path, shards.toListRef()[k - 1], k,
                                        saved_world, global_step, checksums[k],
                                        model_name_, into);
        }
        if (!moved) {
          break;
        }
      }
    });
  }
  if (moved) {
    step_->load_resharded(saved);
  } else {
    step_->load(sharded ? saved[0] : step_archive);
  }
  // The run's own checkpoint, however the two paths are spelled ("./a.pt",
  // "a.pt"): its shards are replaced by the next, and it holds this step.
  const bool own_checkpoint = lamp::detail::same_file(o.checkpoint(), path);
  if (sharded && own_checkpoint) {
    // The next checkpoint replaces the shard files: saved rank k's go with
    // this run's rank k % world.
    previous_shards_.clear();
    for (int64_t k = 1; k < saved_world; ++k) {
      // Only this checkpoint's own: a shard read under the name it was
      // written under belongs to the checkpoint it was copied from.
      if (k % world == rank &&
          files[k] == detail::shard_path(path, static_cast<int>(k),
                                         static_cast<int>(saved_world),
                                         global_step)) {
        previous_shards_.push_back(files[k]);
      }
    }
  }
  at::Generator generator = at::detail::getDefaultCPUGenerator(); // a handle
  generator.set_state(rng_state);
  if (cuda_rng_state.defined()) { // checked above
    auto cuda_generator =
        at::globalContext().defaultGenerator(train_loader_.device());
    std::lock_guard<std::mutex> lock(cuda_generator.mutex());
    cuda_generator.set_state(cuda_rng_state);
  }
  start_epoch_ = next_epoch;
  start_step_in_epoch_ = epoch_step;
  // The saved step unless resharding (then epoch_step is 0).
  global_step_ = next_epoch * batches + epoch_step;
  resumed_loss_sum_ = epoch_step > 0 ? own[0] : 0.0;
  resumed_non_finite_ = epoch_step > 0 ? static_cast<int64_t>(own[1]) : 0;
  resumed_interval_loss_sum_ = own_interval ? own[2] : 0.0;
  resumed_interval_non_finite_ =
      own_interval ? static_cast<int64_t>(own[3]) : 0;
  resumed_interval_steps_ = own_interval ? interval_steps : 0;
  evaluation_pending_ = evaluation_pending;
  best_test_loss_ = best_test_loss;
  best_test_examples_ = best_test_examples;
  checkpoint_step_ = own_checkpoint ? global_step_ : -1;
  if (resharding) {
    history.push_back({detail::kResharded, next_epoch, checkpoint_epochs,
                       o.epochs(), "", saved_shards, shards_now});
  }
  if (checkpoint_epochs < o.epochs()) {
    // A continuation with more epochs (a constant schedule).
    history.push_back(
        {detail::kContinued, next_epoch, checkpoint_epochs, o.epochs(), ""});
  }
  history_ = std::move(history);
}

} // namespace training
} // namespace lamp
