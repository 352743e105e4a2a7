// ClassifierTrainer's checkpoints: what save_checkpoint() writes and
// load_checkpoint() checks and restores (the run's settings are listed in
// run_settings.cpp).
#include "lamp/training/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <string>
#include <utility>

#include "lamp/platform/checkpoint_file.h"
#include "platform/archive.h"
#include "platform/paths.h"
#include "training/divergence_watch.h"
#include "training/run_settings.h"

namespace lamp {
namespace training {
namespace {

using detail::kCheckpointFormat;

// Anything at `path` (data/files.h: POSIX, not std::filesystem).
bool exists(const std::string& path) {
  return lamp::detail::path_kind(path) != lamp::detail::PathKind::kMissing;
}

} // namespace

void ClassifierTrainer::save_checkpoint(const std::string& path) const {
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
  archive.write("next_epoch", c10::IValue(start_epoch_));
  archive.write("global_step", c10::IValue(global_step_));
  detail::write_history(archive, history_);
  // The data order and augmentation come from (seed, epoch); the global CPU
  // generator (weight init, dropout in users' models) is saved as well.
  archive.write("cpu_rng_state",
                at::detail::getDefaultCPUGenerator().get_state());
  torch::serialize::OutputArchive step_archive;
  step_->save(step_archive);
  archive.write("train_step", step_archive);
  save_checked_archive(archive, path);
}

void ClassifierTrainer::load_checkpoint(const std::string& path) {
  TORCH_CHECK(exists(path), "lamp: no checkpoint at ", path,
              " to resume from.");
  torch::serialize::InputArchive archive;
  load_checked_archive(archive, path);
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
  const auto train_images = integer("train_images");
  TORCH_CHECK(train_images == train_loader_.size(), "lamp: ", path,
              " was trained on ", train_images,
              " training images but this run's dataset has ",
              train_loader_.size(), "; resume with the same ",
              name_option(o, "data", "training dataset"), ".");
  const int64_t checkpoint_epochs = detail::check_run_settings(
      archive, path, {o, train_loader_.options(), train_data_, test_data_});
  auto history = detail::read_history(archive, path);
  const int64_t batches = train_loader_.batches_per_epoch();
  const auto steps_per_epoch = integer("steps_per_epoch");
  TORCH_CHECK(steps_per_epoch == batches, "lamp: ", path, " was trained with ",
              steps_per_epoch, " steps per epoch but this run has ", batches,
              " (another ",
              name_option(o, "drop_last", "LoaderOptions::drop_last"),
              " or number of ranks); resume with the same settings.");
  // Written only after complete epochs: the position is (epoch, epoch*steps).
  const auto next_epoch = integer("next_epoch");
  const auto global_step = integer("global_step");
  TORCH_CHECK(next_epoch >= 1 && next_epoch <= checkpoint_epochs &&
                  global_step == next_epoch * batches,
              "lamp: ", path, " is at epoch ", next_epoch, ", step ",
              global_step, ", which a run of ", checkpoint_epochs,
              " epochs of ", batches,
              " steps cannot reach; the checkpoint is damaged.");
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
  torch::serialize::InputArchive step_archive;
  lamp::detail::read_archive(archive, "train_step", step_archive,
                             where.c_str());
  step_->load(step_archive);
  at::Generator generator = at::detail::getDefaultCPUGenerator(); // a handle
  generator.set_state(rng_state);
  start_epoch_ = next_epoch;
  global_step_ = global_step;
  if (checkpoint_epochs < o.epochs()) {
    // A continuation with more epochs (a constant schedule).
    history.push_back(
        {detail::kContinued, next_epoch, checkpoint_epochs, o.epochs(), ""});
  }
  history_ = std::move(history);
}

} // namespace training
} // namespace lamp
