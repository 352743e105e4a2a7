#pragma once

// The part train_cifar10 and train_mnist share: the CLI options, progress,
// printing, the JSON log, and the run itself (which the library does).

#include <lamp/lamp.h>
#include <CLI/CLI.hpp>

#include "cli.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lamp_examples {

struct ProgramConfig {
  std::string model;
  std::vector<std::string> models; // the valid --model values
  std::string precision = "fp32";
  bool fp16 = false; // the seed's spelling of --precision half
  int64_t epochs = 10;
  int64_t batch_size = 128;
  int64_t eval_batch_size = 1000;
  std::string optimizer = "sgd";
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  bool no_bias_decay = false;
  double max_grad_norm = 0.0;
  int64_t accumulation_steps = 1;
  std::string schedule = "onecycle";
  bool cudnn_benchmark = false;
  int64_t cudnn_benchmark_limit = 10; // cuDNN's own default
  std::string drop_last = "auto";
  std::string cuda_graph = "auto";
  bool channels_last = false;
  std::string data;
  std::string device; // default: cuda when available, else cpu
  uint64_t seed = 0;
  std::string checkpoint;
  std::string export_state_dict;
  std::string resume;
  std::string log_json;
  int64_t max_steps = 0;
  int64_t log_every = 0;
  bool progress = true;
  bool report_precision = false;
  std::vector<std::string> command_line; // for the log's run record
};

/// Binds every shared flag to `config` (defaults are whatever `config` holds).
void add_options(CLI::App& app, ProgramConfig& config);

/// A model built for the run, and how to call it.
using BuiltModel = lamp::models::NamedModel;

struct RunSpec {
  std::string program; // for messages
  lamp::data::Dataset train;
  lamp::data::Dataset test;
  std::function<BuiltModel(const std::string& name)> make_model;
  std::vector<double> mean, std;
  int64_t crop_padding = 0;
  bool horizontal_flip = false;
};

/// Resolves the device, builds model, loaders and trainer, trains and prints
/// one line per epoch; when the checkpoint resumed from has already trained
/// all of config.epochs, says so and returns. Throws c10::Error /
/// std::exception on bad input.
void run(const ProgramConfig& config, const RunSpec& spec);

/// A training program's whole main(): parses the flags into `config` (whose
/// fields hold the program's defaults) with the conventions of cli.h, then
/// builds the data with `make_spec` and calls run(); returns the exit status
/// (0, 1 for errors while running, 2 for usage errors).
int program_main(int argc, char** argv, const std::string& program,
                 const std::string& description, ProgramConfig& config,
                 const std::function<RunSpec()>& make_spec);

/// Per-channel mean and standard deviation of uint8 images, in [0, 1] units.
/// Throws when a channel has zero variance (blank images cannot be
/// normalised); `what` names the images in that message ("the training
/// images of 'data/mnist'").
std::pair<std::vector<double>, std::vector<double>> channel_stats(
    const torch::Tensor& images, const std::string& what);

} // namespace lamp_examples
