#pragma once

/// \file
/// The weights of a Trainer checkpoint, for a new run that starts
/// from them: fine-tuning with another schedule, learning rate, number of
/// epochs or precision (TrainerOptions::init_from).

#include <torch/nn/module.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lamp/training/trainer.h"

namespace lamp {

class MasterWeights;

namespace training {

/// What read_checkpoint_weights() finds in a checkpoint.
struct CheckpointWeights {
  /// The checkpoint's path, as given (for messages).
  std::string path;
  /// The model name the checkpoint's run was given
  /// (Trainer's `model_name`).
  std::string model_name;
  /// The complete epochs that run had trained.
  int64_t epochs_done = 0;
  /// That run's history (Trainer::history()).
  std::vector<RunHistoryEntry> history;
  /// Every parameter and buffer by its name in the model
  /// ("layer1.0.bn1.running_mean"), in the model's order, on the CPU. A
  /// parameter the run kept FP32 master weights for (precision half or
  /// bf16) is its master value, not the FP16/BF16 model copy, which is the
  /// master rounded. A run that sharded its optimizer state (ZeRO) kept its
  /// masters in its ranks' shard files: they are read from there (every
  /// rank's, named by the checkpoint, beside it), and where they cannot be
  /// (a shard file missing or damaged), the copy is taken, with a warning
  /// that says why.
  torch::OrderedDict<std::string, torch::Tensor> tensors;
};

/// Reads the weights of the checkpoint at `path`, written by
/// Trainer::save_checkpoint(): its checksum and format are checked,
/// and nothing but the weights is taken (no optimizer state, scaler,
/// position or settings).
CheckpointWeights read_checkpoint_weights(const std::string& path);

/// One setting a checkpoint stores for its run (those a resumed run
/// continues with: precision, optimizer, batch size, epochs, lr, schedule,
/// seed, ...), as the trainer's messages show it.
struct StoredSetting {
  /// The setting's key, as TrainerOptions::option_name receives it
  /// ("batch_size", "lr", "precision", "no_bias_decay").
  std::string key;
  /// Its value as text: "128", "0.05" (exact: reads back to the same
  /// double), "amp-bf16", "true"/"false".
  std::string value;
};

/// What read_checkpoint_settings() finds in a checkpoint.
struct CheckpointSettings {
  /// The checkpoint's path, as given (for messages).
  std::string path;
  /// The model name the checkpoint's run was given.
  std::string model_name;
  /// The complete epochs that run had trained.
  int64_t epochs_done = 0;
  /// Every setting the checkpoint stores, in the order of the trainer's
  /// table; a setting added to the format after the checkpoint was written
  /// is absent.
  std::vector<StoredSetting> settings;
  /// The program's own settings (TrainerOptions::program_settings), as its
  /// run stored them; empty for checkpoints written before they were.
  std::vector<ProgramSetting> program_settings;
  /// The steps that run had trained.
  int64_t global_step = 0;
};

/// Reads the run settings of the checkpoint at `path`, written by
/// Trainer::save_checkpoint() (checksum and format checked), so
/// that a program can continue the run with them: the programs' --resume
/// takes them as the defaults of the flags not given.
CheckpointSettings read_checkpoint_settings(const std::string& path);

/// Loads the weights of the checkpoint at `path` into `model`, for a new run
/// that starts from them:
///  1. read_checkpoint_weights(path);
///  2. every parameter and buffer of `model` must be in the checkpoint with
///     its shape, and every tensor of the checkpoint in `model`; otherwise
///     an error lists the first differences (a tensor missing on either
///     side, another shape: another model, or the same one built for other
///     data) and nothing is changed;
///  3. each tensor is copied into the model's, cast to its dtype and device
///     (FP16/BF16 for a converted model);
///  4. with `master` (TrainStep::master_weights() of a converted model),
///     each parameter's FP32 master gets the checkpoint's FP32 value as it
///     is, unrounded.
///
/// Example:
/// \code
///   auto model = lamp::models::make_resnet("resnet18");
///   lamp::training::load_weights_from_checkpoint(*model, "pretrained.pt");
/// \endcode
///
/// \warning A model converted by network_to_half() before this call gets the
/// rounded values only; give its TrainStep's master weights as `master`
/// (Trainer does this for TrainerOptions::init_from), or load
/// before converting it.
void load_weights_from_checkpoint(torch::nn::Module& model,
                                  const std::string& path,
                                  MasterWeights* master = nullptr);

/// Steps 2 to 4 of load_weights_from_checkpoint() with weights already read
/// by read_checkpoint_weights(): one read for several models, or a look at
/// the checkpoint's epochs and history first.
void load_weights_from_checkpoint(torch::nn::Module& model,
                                  const CheckpointWeights& weights,
                                  MasterWeights* master = nullptr);

} // namespace training
} // namespace lamp
