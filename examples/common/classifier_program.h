#pragma once

// The part train_cifar10 and train_mnist share: the run itself (which the
// library does), composed of the options (options.h), the progress display
// (progress.h) and the JSON log (json_log.h).

#include <lamp/lamp.h>

#include "config_file.h"
#include "options.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lamp_examples {

/// A model built for the run, and how to call it.
using BuiltModel = lamp::models::NamedModel;

struct RunSpec {
  std::string program; // for messages
  lamp::data::Dataset train;
  lamp::data::Dataset test;
  /// The model named by --model, with --fused-bn's choice for the ResNets.
  /// `fused_bn` is "off", "on" or "conv" (ResNetOptions::fused_batch_norm
  /// and fold_batch_norm).
  std::function<BuiltModel(const std::string& name,
                           const std::string& fused_bn)>
      make_model;
  std::vector<double> mean, std;
  /// The files the data was read from: no output may overwrite them.
  std::vector<std::string> data_files;
  int64_t crop_padding = 0;
  bool horizontal_flip = false;
  /// The model's name in checkpoints and logs, checked on resume; empty:
  /// --model's value. train_gpt gives its shape (GPTOptions::name()).
  std::string model_name;
  /// What the model predicts and how it is scored: a class per image
  /// (train_cifar10, train_mnist) or the next token (train_gpt).
  lamp::training::Task task = lamp::training::Task::classification();
  /// The model's parameter count when known before it is built (0: not
  /// checked) and the flags that size it ("--width, --layers"): a model
  /// whose weights, gradients and optimizer moments cannot fit in the
  /// device's memory is refused naming them, before anything is allocated.
  int64_t parameters = 0;
  std::string size_flags;
  /// Writes --export-state-dict's file (the model, the path, the master
  /// weights to take the FP32 values from) where the program has its own
  /// layout (train_gpt's --export-layout); unset: lamp's names.
  std::function<void(const torch::nn::Module& model, const std::string& path,
                     const lamp::models::StateDictOptions& options)>
      export_weights;
  /// Set: run() calls it instead of training and returns its exit status
  /// (train_gpt's --sample-only); nothing else of the spec is used.
  std::function<int()> instead_of_training;
  /// Called on the main rank after a run that trained to its end (not one
  /// stopped by a signal), after --export-state-dict: train_gpt samples
  /// text here.
  std::function<void(const BuiltModel& model, lamp::training::Trainer& trainer)>
      after_training;
  /// Set: lines for the run's first lines (separated by '\n'), for the
  /// device and precision the run resolved (train_gpt's: which code its
  /// fused residual adds and norms and its fused MLPs run); "" prints
  /// nothing.
  std::function<std::string(const torch::Device& device,
                            lamp::Precision precision)>
      kernel_note;
};

/// On `group` (the ranks, joined before the data was read; one process:
/// a group of one), builds model, loaders and trainer, trains and prints
/// one line per epoch (and per --eval-every evaluation); when the checkpoint
/// resumed from has already trained all the run's steps, says so and
/// returns. With --steps, sets config.epochs to the epochs that hold them. Returns the exit status: 0, or
/// 128 + the signal when SIGINT/SIGTERM stopped the run (interruption.h).
/// Throws c10::Error / std::exception on bad input.
int run(ProgramConfig& config, const RunSpec& spec,
        const std::shared_ptr<lamp::distributed::ProcessGroup>& group);

/// A training program's whole main(): parses the flags into `config` (whose
/// fields hold the program's defaults) with the conventions of cli.h, then
/// builds the data with `make_spec` and calls run(); returns the exit status
/// (0, 1 for errors while running, 2 for usage errors).
/// `add_program_options` (optional) adds the program's own flags to the
/// shared ones; `python_config` (optional) reads --config's *.py files
/// (train_gpt: nanoGPT's).
int program_main(
    int argc, char** argv, const std::string& program,
    const std::string& description, ProgramConfig& config,
    const std::function<RunSpec()>& make_spec,
    const std::function<void(CLI::App&)>& add_program_options = nullptr,
    const PythonConfigReader& python_config = {});

/// Refuses, naming the first, any of `flags` typed on the command line
/// (config.command_line: "--flag" or "--flag=value"; a resume's stored
/// values are not typed): "<why>: leave out <flag>." Throws c10::Error.
void refuse_typed_flags(const ProgramConfig& config,
                        const std::vector<std::string>& flags,
                        const std::string& why);

/// The flags that only training uses or writes by (--checkpoint,
/// --log-json, --export-state-dict, --steps, ...): refused by the modes
/// that train nothing (--eval-only, train_gpt's --sample-only).
const std::vector<std::string>& training_only_flags();

/// A channel whose standard deviation (pixels in [0, 1]) is below this is
/// nearly blank: channel_stats() warns.
constexpr double kNearlyBlankStd = 0.01;

/// Per-channel mean and standard deviation of uint8 images, in [0, 1] units.
/// Throws when a channel has zero variance (blank images cannot be
/// normalised) and warns when it is below kNearlyBlankStd; `what` names the
/// images in the messages ("the training images of 'data/mnist'").
std::pair<std::vector<double>, std::vector<double>> channel_stats(
    const torch::Tensor& images, const std::string& what);

/// Warns (TORCH_WARN) when every example of `train` is the same, or every
/// label is: a run on such data ends normally having learnt nothing.
/// `what` names the data in the messages.
void warn_degenerate_data(const lamp::data::Dataset& train,
                          const std::string& what);

} // namespace lamp_examples
