#include "classifier_program.h"

#include <torch/torch.h>

#include "auto_precision.h"
#include "cli.h"
#include "interruption.h"
#include "json_log.h"
#include "output_paths.h"
#include "progress.h"
#include "rank_check.h"
#include "resume_settings.h"
#include "stop_signals.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

namespace lamp_examples {
namespace {

using lamp::distributed::ProcessGroup;
using lamp::training::Trainer;

// "1 epoch", "3 epochs".
std::string count_text(int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// The step flags' contradictions, as the command line gives them (a
// resume's stored values are the trainer's to check): "" when none.
std::string step_flags_error(const CLI::App& app, const ProgramConfig& c) {
  const auto given = [&](const char* flag) {
    const auto* option = app.get_option_no_throw(flag);
    return option != nullptr && option->count() > 0;
  };
  if (given("--steps") && given("--epochs")) {
    return "--steps and --epochs both give the run's length; give one of "
           "them";
  }
  if ((given("--warmup-steps") || given("--min-lr")) &&
      c.schedule != "warmup-cosine") {
    return "--warmup-steps and --min-lr shape --schedule warmup-cosine, not " +
           c.schedule + "; add --schedule warmup-cosine or leave them out";
  }
  // A warm-up the command line gives, against a length it gives (a
  // program's default warm-up longer than the run is resized to 2% of it,
  // size_epochs_for_steps; a resume's stored one is the trainer's to check).
  if (c.schedule == "warmup-cosine" && c.steps > 0 && given("--warmup-steps") &&
      (given("--steps") || !given("--resume")) && c.warmup_steps >= c.steps) {
    return "--warmup-steps " + std::to_string(c.warmup_steps) +
           " is not shorter than --steps " + std::to_string(c.steps) +
           "; give fewer warm-up steps or a longer run";
  }
  if (c.schedule == "warmup-cosine" && given("--min-lr") && c.min_lr > c.lr) {
    return "--min-lr " + short_number(c.min_lr) + " is above --lr " +
           short_number(c.lr) +
           "; the cosine decays from --lr down to --min-lr";
  }
  if (given("--checkpoint-every") && c.checkpoint_every > 0 &&
      c.checkpoint.empty()) {
    return "--checkpoint-every says how often to write --checkpoint, which "
           "is not given; add --checkpoint PATH";
  }
  return "";
}

// What can be refused before training: a --export-state-dict that could not
// be written after it, flags that contradict each other, outputs that would
// overwrite each other or an input, test images the model was not trained
// for.
void check_before_training(const ProgramConfig& config, const RunSpec& spec,
                           bool main_rank) {
  check_flag_combination(config);
  check_distinct_paths(config, spec.data_files);
  if (main_rank) { // the rank that writes the checkpoint (or its index)
    check_earlier_checkpoints(config);
  }
  const auto train = spec.train.inputs.sizes().slice(1);
  const auto test = spec.test.inputs.sizes().slice(1);
  const auto& examples = config.examples;
  TORCH_CHECK(train == test, "--data ", config.data, ": the test ", examples,
              " are ", c10::Join("x", test),
              spec.train.sequences() ? "" : " (channels x height x width)",
              " but the training ", examples, " ", c10::Join("x", train),
              "; the model evaluates on ", examples,
              " of the size it trains on.");
  if (!config.export_state_dict.empty() && main_rank) {
    lamp::check_writable_path(config.export_state_dict, "--export-state-dict");
  }
}

// A `ulimit -v` that leaves this rank too little room: refused before the
// first step, where OpenBLAS would hang taking its work buffers (a thread's
// first matrix product) and oneDNN could crash. The model is built and the
// data read by now; the gradients and optimizer state are still to come.
void check_address_space_for(const BuiltModel& model) {
  int64_t parameters = 0;
  for (const auto& p : model.module->parameters()) {
    parameters += p.numel();
  }
  // FP32 gradients and up to two FP32 moments per parameter.
  lamp::check_address_space(
      lamp::address_space(),
      lamp::address_space_needed(at::get_num_threads(), parameters * 12),
      "training");
}

// A model whose FP32 weights, gradients and optimizer moments alone exceed
// the device's memory is refused before it is built (spec.parameters).
void check_model_fits(const ProgramConfig& config, const RunSpec& spec,
                      torch::Device device) {
  if (spec.parameters <= 0) {
    return;
  }
  const bool sgd = config.optimizer == "sgd";
  const uint64_t per_parameter = sgd ? 12 : 16;
  const auto parameters = static_cast<uint64_t>(spec.parameters);
  const uint64_t bytes =
      parameters > std::numeric_limits<uint64_t>::max() / per_parameter
          ? std::numeric_limits<uint64_t>::max()
          : parameters * per_parameter;
  lamp::check_fits_in_memory(
      bytes, device,
      spec.program + "'s model of " + std::to_string(spec.parameters) +
          " parameters (" + spec.model_name + ") with its FP32 gradients and " +
          (sgd ? "SGD's momentum" : config.optimizer + "'s two moments"),
      "give smaller " + spec.size_flags);
}

// The process-wide switches the flags set: cuDNN's and the seed.
void apply_process_settings(const ProgramConfig& config) {
  lamp::set_cudnn_benchmark(config.cudnn_benchmark);
  lamp::set_cudnn_benchmark_limit(
      static_cast<int>(config.cudnn_benchmark_limit));
  torch::manual_seed(config.seed);
}

// The model on `device`, in the memory format and precision of the flags.
BuiltModel build_model(const ProgramConfig& config, const RunSpec& spec,
                       torch::Device device, lamp::Precision precision) {
  auto model = spec.make_model(config.model, config.fused_bn);
  model.module->to(device);
  if (config.channels_last) {
    lamp::models::to_channels_last(*model.module);
  }
  // "half"/"bf16": fastai's network_to_half, BatchNorm kept FP32, with the
  // input cast in front of the forward (the trainer's TrainStep then finds
  // the model converted). The module, and so the parameter names, stay the
  // model's own.
  if (const auto dtype = lamp::precision_policy(precision).model_dtype) {
    auto half = lamp::network_to_half(model.module, model.forward,
                                      lamp::HalfOptions(*dtype));
    model.forward = [half](const torch::Tensor& x) mutable {
      return half->forward(x);
    };
  }
  return model;
}

// --batch-size's limit, said in the flag's words before the loader says it
// in the library's.
void check_batch_size(const ProgramConfig& config, const RunSpec& spec,
                      int64_t world) {
  const int64_t train_examples = spec.train.size();
  const int64_t per_rank =
      train_examples / world + (train_examples % world != 0);
  TORCH_CHECK(config.batch_size <= per_rank, "--batch-size ", config.batch_size,
              " is larger than the ", train_examples, " training ",
              config.examples,
              world > 1 ? " (" + std::to_string(per_rank) + " per rank)"
                        : std::string(),
              "; use --batch-size ", per_rank, " or less.");
}

// --epochs and --max-steps against the steps the run has.
void check_step_count(const ProgramConfig& config, int64_t batches_per_epoch) {
  // --epochs is at most a million, so this holds unless a dataset has
  // billions of batches; the schedule's length must fit int64.
  TORCH_CHECK(
      config.epochs <= std::numeric_limits<int64_t>::max() / batches_per_epoch,
      "--epochs ", config.epochs, " times ", batches_per_epoch,
      " steps per epoch overflows the step count; use fewer epochs.");
  const int64_t total_steps =
      config.steps > 0 ? config.steps : config.epochs * batches_per_epoch;
  TORCH_CHECK(config.max_steps <= total_steps, "--max-steps ", config.max_steps,
              " is more than the run's ", total_steps, " steps (",
              config.steps > 0 ? "--steps"
                               : std::to_string(config.epochs) + " epochs of " +
                                     std::to_string(batches_per_epoch),
              "); give at most ", total_steps, ", or 0 for no limit.");
}

// Token windows served once an epoch (--windows fixed) in batches that
// --accumulation-steps does not divide: the library would refuse it in its
// own words; here the program's flag that fixes it is named too.
void check_fixed_windows_accumulate(const ProgramConfig& config,
                                    int64_t batches_per_epoch) {
  TORCH_CHECK(config.sequence_length == 0 || config.windows == "random" ||
                  batches_per_epoch % config.accumulation_steps == 0,
              "--windows fixed serves each window once an epoch, in ",
              batches_per_epoch, " batches, which --accumulation-steps ",
              config.accumulation_steps,
              " does not divide: give --windows random (nanoGPT's draw, its "
              "epochs rounded down to whole accumulation cycles), or an "
              "--accumulation-steps or --batch-size whose cycles fill the "
              "epoch.");
}

// --steps: the epochs that hold the run, the last one possibly partial. A
// program's default warm-up (train_gpt's 100 steps) longer than the run
// becomes nanoGPT's share of it, 2%.
void size_epochs_for_steps(ProgramConfig& config, int64_t batches_per_epoch) {
  if (config.steps > 0) {
    config.epochs = (config.steps + batches_per_epoch - 1) / batches_per_epoch;
  }
  const int64_t total =
      config.steps > 0 ? config.steps : config.epochs * batches_per_epoch;
  if (!config.warmup_given && config.schedule == "warmup-cosine" &&
      config.warmup_steps >= total) {
    config.warmup_steps = total / 50;
  }
}

// The training data shuffled and augmented as `spec` says, sharded over the
// ranks.
lamp::data::LoaderOptions train_loader_options(const ProgramConfig& config,
                                               const RunSpec& spec,
                                               const ProcessGroup& group) {
  return lamp::data::LoaderOptions(config.batch_size)
      .dtype(config.sequence_length > 0 ? torch::kLong : torch::kFloat)
      .seed(config.seed)
      .random_windows(config.windows == "random")
      // An epoch of random windows whole accumulation cycles, on any data.
      .batches_multiple_of(
          config.windows == "random" ? config.accumulation_steps : 1)
      .crop_padding(spec.crop_padding)
      .horizontal_flip(spec.horizontal_flip)
      .mean(spec.mean)
      .std(spec.std)
      .channels_last(config.channels_last)
      .drop_last(config.drop_last == "on" ||
                 (config.drop_last == "auto" && group.device().is_cuda()))
      .num_shards(group.world_size())
      .shard(group.rank());
}

// The test data in order, in batches of `eval_batch_size`.
lamp::data::LoaderOptions test_loader_options(const ProgramConfig& config,
                                              const RunSpec& spec,
                                              int64_t eval_batch_size) {
  return lamp::data::LoaderOptions(eval_batch_size)
      .dtype(config.sequence_length > 0 ? torch::kLong : torch::kFloat)
      .shuffle(false)
      .mean(spec.mean)
      .std(spec.std)
      .channels_last(config.channels_last);
}

// The training loader; with --steps, config.epochs becomes the epochs that
// hold them.
lamp::data::DeviceLoader build_train_loader(
    ProgramConfig& config, const RunSpec& spec,
    const std::shared_ptr<ProcessGroup>& group) {
  check_batch_size(config, spec, group->world_size());
  lamp::data::DeviceLoader train_loader(
      spec.train, group->device(), train_loader_options(config, spec, *group));
  size_epochs_for_steps(config, train_loader.batches_per_epoch());
  check_step_count(config, train_loader.batches_per_epoch());
  check_fixed_windows_accumulate(config, train_loader.batches_per_epoch());
  return train_loader;
}

// The trainer over both loaders.
Trainer build_trainer(const ProgramConfig& config, const RunSpec& spec,
                      const BuiltModel& model,
                      const std::shared_ptr<ProcessGroup>& group,
                      lamp::data::DeviceLoader train_loader) {
  const auto device = group->device();
  // One evaluation batch can hold at most the whole test set.
  const int64_t eval_batch_size =
      std::min(config.eval_batch_size, spec.test.size());
  const auto test_options = test_loader_options(config, spec, eval_batch_size);
  auto options = trainer_options_from(config, eval_batch_size, group);
  // SIGINT/SIGTERM: the trainer stops at the next step (stop_signals.h).
  options.stop_requested([] { return stop_signal() != 0; });
  options.task(spec.task);
  if (model.loss) {
    options.training_loss(model.loss); // a GPT's fused head and loss
  }
  return Trainer(model.module, model.forward,
                 spec.model_name.empty() ? config.model : spec.model_name,
                 std::move(train_loader),
                 lamp::data::DeviceLoader(spec.test, device, test_options),
                 std::move(options));
}

// Resuming a run that has trained all its steps trains nothing and says so.
void print_run_complete(const ProgramConfig& config, const RunSpec& spec,
                        const Trainer& trainer) {
  const auto done = std::to_string(trainer.global_step());
  const auto total = std::to_string(trainer.total_steps());
  // The flag that measures this run is the one that lengthens it.
  const std::string flag = config.steps > 0 ? "--steps" : "--epochs";
  const auto length =
      flag + " " +
      std::to_string(config.steps > 0 ? config.steps : config.epochs);
  print_out(
      "%s: the run is complete (%s of %s steps, %s, in %s); nothing "
      "to train. Give a larger %s where the schedule allows it "
      "(constant), or start a new run from these weights with "
      "--init-from %s.\n",
      spec.program.c_str(), done.c_str(), total.c_str(), length.c_str(),
      config.resume.c_str(), flag.c_str(), config.resume.c_str());
}

// Resuming a run whose checkpoint is at or past --max-steps trains nothing
// either: the limit counts the run's steps from its start, not this
// process's.
void print_max_steps_reached(const ProgramConfig& config, const RunSpec& spec,
                             const Trainer& trainer) {
  const auto done = std::to_string(trainer.global_step());
  const auto total = std::to_string(trainer.total_steps());
  const auto limit = std::to_string(config.max_steps);
  print_out(
      "%s: %s is at step %s of %s, and --max-steps %s stops the run at step "
      "%s (it counts from the run's start, not from the resume); nothing to "
      "train. Give a larger --max-steps (at most %s), or none, to go on.\n",
      spec.program.c_str(), config.resume.c_str(), done.c_str(), total.c_str(),
      limit.c_str(), limit.c_str(), total.c_str());
}

// --report-precision: the dtypes of the model and of one evaluation pass.
void print_precision_report(Trainer& trainer, const BuiltModel& model) {
  // Evaluation changes nothing, so observing it leaves the run as it was.
  const auto ops = lamp::op_precision_report([&] { trainer.evaluate(); });
  print_out("%s\nops of one evaluation pass:\n%s\n",
            lamp::precision_report(*model.module).to_string().c_str(),
            ops.to_string().c_str());
}

// The --log-json file with its run record; nullptr without --log-json or on
// ranks other than the main one.
std::unique_ptr<JsonLog> open_json_log(const ProgramConfig& config,
                                       const RunSpec& spec,
                                       const ProcessGroup& group,
                                       Trainer& trainer,
                                       lamp::Precision precision) {
  if (config.log_json.empty() || !group.is_main()) {
    return nullptr;
  }
  RunFacts facts;
  facts.program = spec.program;
  facts.device = group.device();
  facts.world_size = group.world_size();
  facts.precision = precision;
  facts.precision_auto = config.requested_precision == lamp::Precision::kAuto;
  facts.cuda_graph = trainer.train_step().cuda_graph_enabled();
  facts.train_examples = spec.train.size();
  facts.test_examples = spec.test.size();
  facts.start_epoch = trainer.start_epoch();
  return std::make_unique<JsonLog>(config, std::move(facts));
}

// Where the run starts, for its first line: "resuming at epoch N", with
// "continuing the N-epoch run" where it gives the run more epochs, or the
// checkpoint whose weights it starts from.
std::string start_note(const ProgramConfig& config, const Trainer& trainer) {
  std::string note;
  if (trainer.global_step() > 0 && !config.resume.empty()) {
    note = ", resuming at epoch " + std::to_string(trainer.start_epoch() + 1);
    if (trainer.start_step_in_epoch() > 0) {
      note += " step " + std::to_string(trainer.start_step_in_epoch() + 1);
    }
  }
  const auto& history = trainer.history();
  if (!config.resume.empty() && !history.empty() &&
      history.back().kind == "continued" &&
      history.back().at_epoch == trainer.start_epoch() &&
      history.back().epochs == config.epochs) {
    note += " (continuing the " +
            std::to_string(history.back().previous_epochs) + "-epoch run)";
  }
  for (const auto& entry : history) {
    if (config.reshard && entry.kind == "resharded" &&
        entry.at_epoch == trainer.start_epoch()) {
      note += " on " + std::to_string(entry.ranks) +
              (entry.ranks == 1 ? " rank" : " ranks") +
              " (the checkpoint's run had " +
              std::to_string(entry.previous_ranks) +
              "; --reshard: optimizer state re-sharded, data split anew)";
    }
  }
  if (!config.init_from.empty()) {
    note += ", from the weights of " + config.init_from;
  }
  if (!config.init_from_python.empty()) {
    note += ", from the Python weights of " + config.init_from_python;
  }
  return note;
}

// The run's first line: model, precision, device, data, batch, epochs, and
// why CUDA graphs are off where the flags left them to the library.
// Why a ResNet on a GPU trains without the BatchNorm fusion --fused-bn
// asked for, as the line to print ("fused BatchNorm + ReLU off: ..."), or ""
// (the fusion applies, or the run is not one where it could).
std::string fused_batch_norm_off_reason(const ProgramConfig& config,
                                        const torch::Device& device,
                                        lamp::Precision precision) {
  if (!device.is_cuda() || config.fused_bn == "off" ||
      config.model.rfind("resnet", 0) != 0) {
    return "";
  }
  const std::string what = config.fused_bn == "conv"
                               ? "BatchNorm folded into the convolutions off"
                               : "fused BatchNorm + ReLU off";
  std::string why;
  if (config.fused_bn == "conv" &&
      !lamp::ops::conv_batch_norm_fusion_built(&why)) {
    return what + " (the blocks run --fused-bn on): " + why;
  }
  if (!lamp::ops::batch_norm_relu_fusion_built(&why)) {
    return what + ": " + why;
  }
  if (!config.channels_last) {
    return what + ": it needs --channels-last (NHWC activations).";
  }
  const auto policy = lamp::precision_policy(precision);
  if (!policy.autocast_dtype && !policy.model_dtype) {
    return what +
           ": it needs half or bfloat16 activations (--precision amp, "
           "amp-bf16, half or bf16).";
  }
  return "";
}

// 1234567 as "1,234,567" (a count: not negative).
std::string grouped(int64_t n) {
  const auto digits = std::to_string(n);
  std::string text;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) {
      text += ',';
    }
    text += digits[i];
  }
  return text;
}

// A language model's tokens an optimizer step, nanoGPT's "tokens per
// iteration" (every rank's accumulated batches), and over the run.
std::string token_budget_line(const ProgramConfig& config,
                              const ProcessGroup& group, Trainer& trainer) {
  const int64_t batch_tokens = config.batch_size * config.sequence_length;
  const int64_t accumulation = config.accumulation_steps;
  const int64_t ranks = group.world_size();
  std::string parts = std::to_string(config.batch_size) + " sequences of " +
                      std::to_string(config.sequence_length) + " tokens";
  if (accumulation > 1) {
    parts += " x " + std::to_string(accumulation) + " accumulated batches";
  }
  if (ranks > 1) {
    parts += " x " + std::to_string(ranks) + " ranks";
  }
  return grouped(batch_tokens * accumulation * ranks) +
         " tokens an optimizer step (" + parts +
         ": nanoGPT's tokens per iteration), " +
         grouped(batch_tokens * ranks * trainer.total_steps()) +
         " over the run's " + std::to_string(trainer.total_steps()) +
         (trainer.total_steps() == 1 ? " batch" : " batches");
}

void print_run_header(const ProgramConfig& config, const RunSpec& spec,
                      const ProcessGroup& group, Trainer& trainer,
                      lamp::Precision precision) {
  const auto& step = trainer.train_step();
  const auto device = group.device();
  print_out(
      "%s: %s, %s%s on %s, %lld train / %lld test %s, batch %lld, %s%s%s%s, %lld %s\n",
      spec.program.c_str(),
      (spec.model_name.empty() ? config.model : spec.model_name).c_str(),
      lamp::to_string(precision).c_str(),
      config.requested_precision == lamp::Precision::kAuto ? " (auto)" : "",
      device.str().c_str(), static_cast<long long>(spec.train.size()),
      static_cast<long long>(spec.test.size()),
      config.sequence_length > 0
          ? ("sequences of " + std::to_string(config.sequence_length) +
             " tokens" +
             (config.windows == "random"
                  ? " (the training ones at random offsets)"
                  : ""))
                .c_str()
          : "images",
      static_cast<long long>(config.batch_size),
      config.steps > 0 ? ("steps " + std::to_string(config.steps) + " (" +
                          count_text(config.epochs, "epoch") + ")")
                             .c_str()
                       : count_text(config.epochs, "epoch").c_str(),
      start_note(config, trainer).c_str(),
      group.is_distributed()
          ? (", data-parallel over " + std::to_string(group.world_size()) +
             " ranks (" + group.backend() + "), batch per rank")
                .c_str()
          : "",
      step.cuda_graph_enabled() ? ", CUDA graphs" : "",
      static_cast<long long>(config.threads),
      config.threads == 1 ? "thread" : "threads");
  if (config.sequence_length > 0) {
    print_out("%s: %s\n", spec.program.c_str(),
              token_budget_line(config, group, trainer).c_str());
  }
  if (!config.auto_line.empty()) {
    print_out("%s: %s\n", spec.program.c_str(), config.auto_line.c_str());
  }
  if (!config.resume_line.empty() && group.is_main()) {
    print_out("%s: resumed from %s: %s\n", spec.program.c_str(),
              config.resume.c_str(), config.resume_line.c_str());
  }
  const std::string note =
      spec.kernel_note ? spec.kernel_note(device, precision) : "";
  // One line per fused code the note names.
  for (size_t from = 0; from < note.size();) {
    const size_t end = std::min(note.find('\n', from), note.size());
    print_out("%s: %s\n", spec.program.c_str(),
              note.substr(from, end - from).c_str());
    from = end + 1;
  }
  if (device.is_cuda() && !step.cuda_graph_enabled() &&
      config.cuda_graph == "auto") {
    print_out("%s: CUDA graphs off: %s\n", spec.program.c_str(),
              step.cuda_graph_unavailable_reason().c_str());
  }
  // fp8: which Linear layers compute in FP8, and why the others do not.
  const auto& float8 = step.float8_conversion();
  if (!float8.converted.empty()) {
    std::string left;
    for (const auto& item : float8.skipped) {
      left +=
          (left.empty() ? "" : "; ") + item.first + " (" + item.second + ")";
    }
    const auto recipe = float8_recipe_from(config);
    const auto recipe_text =
        recipe.scaling() == lamp::nn::Float8Scaling::kDelayed
            ? "delayed scaling, amax history " +
                  std::to_string(recipe.amax_history_len()) + ", margin " +
                  std::to_string(recipe.margin())
            : "current scaling, margin " + std::to_string(recipe.margin());
    const auto casts = recipe.fused_casts() ? ", one-pass casts" : "";
    print_out("%s: FP8 products (%s%s) in %zu Linear layers%s%s\n",
              spec.program.c_str(), recipe_text.c_str(), casts,
              float8.converted.size(),
              left.empty() ? "" : "; in BF16: ", left.c_str());
  }
  const auto fused_bn_off =
      fused_batch_norm_off_reason(config, device, precision);
  if (!fused_bn_off.empty()) {
    print_out("%s: %s\n", spec.program.c_str(), fused_bn_off.c_str());
  }
}

// Trains; on the main rank a line (and a log record) per epoch and per
// --eval-every evaluation.
void train(Trainer& trainer, Progress& progress, JsonLog* log, bool main_rank) {
  const int64_t total_steps = trainer.total_steps();
  trainer.fit(
      [&](const lamp::training::EpochStats& s) {
        if (!main_rank) {
          return;
        }
        // The checkpoint of the epoch is written; its record next, so that
        // a failure to print the line (stdout gone) leaves the two agreeing.
        if (log) {
          log->write_epoch(s);
        }
        progress.print_epoch(s);
      },
      progress.on_batch(), progress.on_eval_batch(),
      [&](const lamp::training::StepEvaluation& e) {
        if (!main_rank) {
          return;
        }
        if (log) {
          log->write_evaluation(e);
        }
        progress.print_evaluation(e, total_steps);
      });
}

// --export-state-dict: the trained weights (the FP32 master weights where
// the run keeps them) as a Python state_dict.
void export_weights(const ProgramConfig& config, const RunSpec& spec,
                    const BuiltModel& model, Trainer& trainer, bool main_rank) {
  auto& step = trainer.train_step();
  auto* masters = step.master_weights();
  std::unique_ptr<lamp::MasterWeights> gathered;
  auto* sharding = step.optimizer_sharding();
  if (sharding != nullptr && step.policy().model_dtype) {
    // --zero 1 with an FP16/BF16 model: every rank holds a shard of the FP32
    // masters; all ranks gather them (a collective), rank 0 exports.
    auto full = sharding->gather_masters();
    if (!main_rank) {
      return;
    }
    gathered = lamp::trainable_masters(*model.module);
    torch::NoGradGuard no_grad;
    auto master_params = gathered->master_params();
    for (size_t i = 0; i < master_params.size(); ++i) {
      master_params[i].copy_(full.at(i));
    }
    masters = gathered.get();
  }
  if (!main_rank) {
    return;
  }
  const auto options = lamp::models::StateDictOptions().master_weights(masters);
  try {
    if (spec.export_weights) {
      spec.export_weights(*model.module, config.export_state_dict, options);
    } else if (!spec.model_name.empty()) {
      // A model outside the registry: its own parameter names.
      lamp::models::export_state_dict(*model.module, config.export_state_dict,
                                      options);
    } else {
      lamp::models::export_state_dict(*model.module, config.model,
                                      config.export_state_dict, options);
    }
  } catch (const c10::Error& e) {
    // Training finished before the export failed: say what of it is kept.
    TORCH_CHECK(
        false, e.what_without_backtrace(), " The training itself finished: ",
        config.checkpoint.empty()
            ? std::string("this run wrote no checkpoint (--checkpoint), "
                          "so its weights were only in memory")
            : config.checkpoint +
                  " holds its weights, as written at "
                  "its last step",
        ".");
  }
}

// --eval-only: the test set's evaluation of the weights the trainer loaded
// (--resume's or --init-from's), its line, and nothing written. Returns the
// exit status (128 + the signal that stopped it; 1 on a rank that another
// rank's signal stopped).
int evaluate_only(const ProgramConfig& config, const RunSpec& spec,
                  const ProcessGroup& group, Trainer& trainer,
                  lamp::Precision precision, const std::string& source) {
  const bool main_rank = group.is_main();
  const bool language_model = config.sequence_length > 0;
  const auto examples = static_cast<long long>(spec.test.size());
  if (main_rank) {
    print_out(
        "%s: evaluating %s: %s, %s%s on %s, %lld %s, batch %lld%s, %lld %s\n",
        spec.program.c_str(), source.c_str(),
        (spec.model_name.empty() ? config.model : spec.model_name).c_str(),
        lamp::to_string(precision).c_str(),
        config.requested_precision == lamp::Precision::kAuto ? " (auto)" : "",
        group.device().str().c_str(), examples,
        language_model ? ("validation sequences of " +
                          std::to_string(config.sequence_length) + " tokens")
                             .c_str()
                       : "test images",
        static_cast<long long>(config.eval_batch_size),
        group.is_distributed()
            ? (" over " + std::to_string(group.world_size()) + " ranks").c_str()
            : "",
        static_cast<long long>(config.threads),
        config.threads == 1 ? "thread" : "threads");
    if (!config.auto_line.empty()) {
      print_out("%s: %s\n", spec.program.c_str(), config.auto_line.c_str());
    }
  }
  auto progress = Progress::for_program(config, main_rank, false, nullptr);
  const auto on_batch = progress.on_eval_batch();
  // The test set's evaluation, then with --eval-train the training data's,
  // a line each.
  const std::vector<bool> splits = config.eval_train
                                       ? std::vector<bool>{false, true}
                                       : std::vector<bool>{false};
  for (const bool training_data : splits) {
    const auto start = std::chrono::steady_clock::now();
    lamp::training::Evaluation e;
    // A signal stops the evaluation; over ranks, every rank at one batch.
    if (!trainer.evaluate_unless_stopped(e, training_data, on_batch)) {
      progress.clear();
      const int signal = stop_signal();
      if (main_rank) {
        std::cout.flush();
        std::cerr << spec.program << ": "
                  << stop_reason(signal, trainer.stop_point().asked_by_rank)
                  << " while evaluating; nothing was written" << std::endl;
      }
      return interrupted_status(signal);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    progress.clear();
    if (main_rank) {
      print_out(
          "%s: %s  %lld %s%s in %.2f s\n", spec.program.c_str(),
          evaluation_text(e.loss, e.accuracy, e.batches, e.batches_in_set,
                          language_model, training_data)
              .c_str(),
          static_cast<long long>(e.examples),
          language_model ? "sequences" : "images",
          language_model
              ? (" (" + std::to_string(e.predictions) + " tokens)").c_str()
              : "",
          seconds);
    }
  }
  return stop_signal() != 0 ? 128 + stop_signal() : 0;
}

} // namespace

std::pair<std::vector<double>, std::vector<double>> channel_stats(
    const torch::Tensor& images, const std::string& what) {
  TORCH_CHECK(images.scalar_type() == torch::kByte && images.dim() == 4, what,
              " must be uint8 [N, C, H, W], got ", images.scalar_type(), " ",
              images.sizes(), ".");
  std::vector<double> mean, std;
  for (int64_t c = 0; c < images.size(1); ++c) {
    // From the channel's histogram, exact integer counts summed in a fixed
    // order: the same bits on every machine and thread count (a checkpoint
    // stores them, and a resume and the ranks compare them), with no
    // FP64 copy of the channel (8 bytes a pixel).
    const auto counts =
        torch::bincount(images.select(1, c).reshape({-1}), {}, 256);
    const auto* count = counts.data_ptr<int64_t>();
    int64_t n = 0;
    double sum = 0;
    for (int v = 0; v < 256; ++v) {
      n += count[v];
      sum += static_cast<double>(v) * static_cast<double>(count[v]);
    }
    const double m = sum / static_cast<double>(n);
    double squares = 0; // about the mean: no cancellation
    for (int v = 0; v < 256; ++v) {
      squares += static_cast<double>(count[v]) * (v - m) * (v - m);
    }
    // The unbiased estimate, as torch::std's default, of pixels in [0, 1].
    mean.push_back(m / 255.0);
    std.push_back(std::sqrt(squares / static_cast<double>(n - 1)) / 255.0);
    TORCH_CHECK(
        std.back() > 0, what, " have zero variance in channel ", c,
        " (every pixel is ", static_cast<int>(mean.back() * 255 + 0.5),
        ", e.g. all black), so they cannot be normalised; the data is blank or corrupt.");
    if (std.back() < kNearlyBlankStd) {
      TORCH_WARN(what, " are nearly blank: channel ", c,
                 " varies by a standard deviation of ", std.back(),
                 " (pixels in [0, 1]); normalising divides by it and "
                 "magnifies every pixel's noise ",
                 static_cast<int64_t>(1.0 / std.back()),
                 "-fold. Check the data.");
    }
  }
  return {mean, std};
}

void warn_degenerate_data(const lamp::data::Dataset& train,
                          const std::string& what) {
  // The first 2^20 examples: all of CIFAR-10's and a text's windows, and
  // not the whole of a memory-mapped token file of billions of ids.
  const int64_t head = std::min<int64_t>(train.inputs.size(0), 1 << 20);
  const auto inputs = train.inputs.slice(0, 0, head);
  const auto targets = train.targets.slice(0, 0, head);
  const bool all = head == train.inputs.size(0);
  const std::string examples =
      (all ? "" : "first ") + std::to_string(head) + " examples";
  if (inputs.size(0) > 1 && inputs.eq(inputs[0]).all().item<bool>()) {
    TORCH_WARN("every one of the ", examples, " of ", what,
               " is the same: there is nothing to learn from them. Check "
               "the data.");
  }
  if (targets.numel() > 1 &&
      targets.eq(targets.flatten()[0]).all().item<bool>()) {
    TORCH_WARN(
        "every ", train.sequences() ? "target token" : "label",
        all ? "" : " of the " + examples, " of ", what, " is ",
        lamp::data::widen_token_ids(targets.flatten()[0], train.unsigned_ids)
            .item<int64_t>(),
        ": the model can only learn to answer that. Check the data.");
  }
}

void refuse_typed_flags(const ProgramConfig& config,
                        const std::vector<std::string>& flags,
                        const std::string& why) {
  for (const auto& flag : flags) {
    for (const auto& arg : config.command_line) {
      TORCH_CHECK(arg != flag && arg.rfind(flag + "=", 0) != 0, why,
                  ": leave out ", flag, ".");
    }
  }
}

const std::vector<std::string>& training_only_flags() {
  static const std::vector<std::string> flags = {"--export-state-dict",
                                                 "--log-json",
                                                 "--checkpoint",
                                                 "--checkpoint-every",
                                                 "--max-steps",
                                                 "--eval-every",
                                                 "--steps",
                                                 "--epochs",
                                                 "--reshard",
                                                 "--check-numerics"};
  return flags;
}

namespace {

// Under torchrun: one rank per process, the CUDA device of LOCAL_RANK;
// otherwise a single-process group. Null when a signal stopped the wait at
// the rendezvous (said on stderr).
std::shared_ptr<ProcessGroup> join_ranks(const ProgramConfig& config,
                                         const std::string& program) {
  try {
    return ProcessGroup::from_environment(
        resolve_device(config.device),
        lamp::distributed::ProcessGroupOptions()
            .timeout(std::chrono::milliseconds(
                static_cast<int64_t>(config.dist_timeout * 1000.0)))
            // The first signal stops a rank that waits for the others.
            .stop_requested([] { return stop_signal() != 0; }));
  } catch (const c10::Error&) {
    if (stop_signal() == 0) {
      throw;
    }
    std::cerr << program << ": interrupted (" << signal_name(stop_signal())
              << ") while waiting for the other ranks at the rendezvous; "
              << "nothing was trained or written; run the command again to "
                 "start"
              << (config.resume.empty() || config.eval_only
                      ? " over"
                      : " from " + config.resume)
              << std::endl;
    return nullptr;
  }
}

} // namespace

namespace {

// The numbers of a stored list setting ("0.1307, 0.3081"); empty for
// "none" or text that is not a list of numbers.
std::vector<double> stored_numbers(const std::string& text) {
  std::vector<double> values;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      values.push_back(std::stod(item, &used));
      if (item.find_first_not_of(' ', used) != std::string::npos) {
        return {};
      }
    } catch (const std::exception&) {
      return {};
    }
  }
  return values;
}

bool numbers_agree(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(a[i] - b[i]) <=
          1e-12 * std::max(std::abs(a[i]), std::abs(b[i])))) {
      return false;
    }
  }
  return true;
}

// --eval-only of a lamp checkpoint normalises as the run it evaluates did:
// with the mean and std it stored (train_mnist measures them from its
// training images), not those of --data's training images, which may be
// another set's. `spec` itself where the checkpoint stores none, or other
// channels, or is not a lamp checkpoint (its load then says why).
RunSpec with_stored_statistics(const ProgramConfig& config, const RunSpec& spec,
                               bool main_rank) {
  if (!config.eval_only || config.init_from.empty() || spec.mean.empty()) {
    return spec;
  }
  std::vector<double> mean, std;
  try {
    for (const auto& setting :
         lamp::training::read_checkpoint_settings(config.init_from).settings) {
      if (setting.key == "mean") {
        mean = stored_numbers(setting.value);
      } else if (setting.key == "std") {
        std = stored_numbers(setting.value);
      }
    }
  } catch (const c10::Error&) {
    return spec;
  }
  if (mean.size() != spec.mean.size() || std.size() != spec.std.size()) {
    return spec;
  }
  if (main_rank &&
      !(numbers_agree(mean, spec.mean) && numbers_agree(std, spec.std))) {
    const auto list = [](const std::vector<double>& values) {
      std::string text;
      for (const double v : values) {
        text += (text.empty() ? "" : ", ") + c10::str(v);
      }
      return text;
    };
    std::cout << spec.program << ": normalising with the mean (" << list(mean)
              << ") and std (" << list(std) << ") " << config.init_from
              << " was trained with, not those of " << config.data
              << "'s training images (" << list(spec.mean) << "; "
              << list(spec.std) << ")" << std::endl;
  }
  RunSpec stored = spec;
  stored.mean = mean;
  stored.std = std;
  return stored;
}

} // namespace

int run(ProgramConfig& config, const RunSpec& given_spec,
        const std::shared_ptr<ProcessGroup>& group) {
  // --eval-only evaluates a checkpoint's weights, not its run: loaded as
  // --init-from loads them, in this command's precision, on this data.
  std::string evaluated;
  if (config.eval_only) {
    evaluated = !config.resume.empty()      ? config.resume
                : !config.init_from.empty() ? config.init_from
                                            : config.init_from_python;
    if (!config.resume.empty()) {
      config.init_from = config.resume;
      config.resume.clear();
    }
  }
  const bool main_rank = group->is_main();
  const RunSpec spec = with_stored_statistics(config, given_spec, main_rank);
  // "auto" is resolved here, once, before the model is converted for it
  // (and before the run's seed is set: a measurement builds models); the
  // library, the header and the log receive the resolved mode.
  if (config.requested_precision == lamp::Precision::kAuto) {
    const auto chosen = resolve_auto_precision(
        config, spec.train, spec.task, *group,
        [&](lamp::Precision p) {
          // Its steps are the run's first matrix products: the same
          // address-space check as the run's own model, before them.
          auto measured = build_model(config, spec, group->device(), p);
          check_address_space_for(measured);
          return measured;
        },
        config.auto_stored);
    config.precision_mode = chosen.precision;
    config.auto_line = chosen.line;
  } else {
    config.precision_mode = config.requested_precision;
  }
  const auto precision = config.precision_mode;
  if (config.flops_per_example > 0) {
    // MFU's denominator: the flag, or the datasheet's peak of this GPU.
    if (config.peak_tflops > 0) {
      config.peak_flops = config.peak_tflops * 1e12;
      config.peak_source = "--peak-tflops";
    } else if (group->device().is_cuda()) {
      const auto name = lamp::device_capabilities(group->device()).name;
      config.peak_flops = lamp::peak_flops(name, precision);
      config.peak_source = name + ", " + lamp::to_string(precision);
    }
  }
  if (main_rank) {
    warn_ineffective_flags(config, group->device());
    warn_degenerate_data(spec.train, "the training data");
  }
  apply_process_settings(config);
  auto model = build_model(config, spec, group->device(), precision);
  check_address_space_for(model);
  auto train_loader = build_train_loader(config, spec, group);
  auto trainer =
      build_trainer(config, spec, model, group, std::move(train_loader));
  if (config.eval_only) {
    if (config.report_precision && main_rank) {
      print_precision_report(trainer, model);
    }
    return evaluate_only(config, spec, *group, trainer, precision, evaluated);
  }
  if (trainer.finished()) {
    if (main_rank) {
      print_run_complete(config, spec, trainer);
    }
    return 0;
  }
  if (config.max_steps > 0 && trainer.global_step() >= config.max_steps) {
    if (main_rank) {
      print_max_steps_reached(config, spec, trainer);
    }
    return 0;
  }
  if (config.report_precision && main_rank) {
    print_precision_report(trainer, model);
  }
  const auto log = open_json_log(config, spec, *group, trainer, precision);
  try {
    if (main_rank) {
      print_run_header(config, spec, *group, trainer, precision);
    }
    // The scale is shown where the loss is scaled, not where the scaler
    // only skips non-finite steps (skip_non_finite, at a static scale of 1).
    const auto& step = trainer.train_step();
    auto progress = Progress::for_program(
        config, main_rank,
        step.policy().loss_scaling || step.options().force_loss_scaling(),
        log.get());
    train(trainer, progress, log.get(), main_rank);
    if (trainer.stop_point().stopped) {
      return main_rank ? report_interruption(config, spec.program, trainer,
                                             progress, log.get(), stop_signal())
                       : interrupted_status(stop_signal());
    }
    if (!config.export_state_dict.empty()) {
      export_weights(config, spec, model, trainer, main_rank);
    }
    if (spec.after_training && main_rank) {
      spec.after_training(model, trainer);
      if (stop_signal() != 0) {
        return 128 + stop_signal(); // it stopped there (train_gpt's sample)
      }
    }
  } catch (const std::exception& e) {
    // The log says why it ends where it ends.
    if (log) {
      log->write_error(error_message(e));
    }
    throw;
  }
  return 0;
}

int program_main(int argc, char** argv, const std::string& program,
                 const std::string& description, ProgramConfig& config,
                 const std::function<RunSpec()>& make_spec,
                 const std::function<void(CLI::App&)>& add_program_options,
                 const PythonConfigReader& python_config) {
  CLI::App app{description, program};
  add_options(app, config);
  if (add_program_options) {
    add_program_options(app);
  }
  add_version_flag(app, program);
  SettingsSources sources; // the flags --config set, for the errors
  const int status =
      parse_command_line(app, program, argc, argv, python_config, &sources);
  if (status >= 0) {
    return status;
  }
  // --epochs alone measures the run in epochs, where the program's default
  // is a length in steps (train_gpt's): evaluated after every epoch too,
  // unless --eval-every says otherwise.
  const auto* steps_flag = app.get_option_no_throw("--steps");
  if (app.get_option("--epochs")->count() > 0 && steps_flag->count() == 0) {
    config.steps = 0;
    if (app.get_option("--eval-every")->count() == 0) {
      config.eval_every = 0;
    }
  }
  config.warmup_given = app.get_option("--warmup-steps")->count() > 0;
  // A program's default --min-lr above a given --lr (a fine-tuning rate)
  // becomes a tenth of it, nanoGPT's ratio, as a default warm-up longer
  // than the run becomes 2% of it.
  const auto* min_lr_flag = app.get_option_no_throw("--min-lr");
  if (min_lr_flag != nullptr && min_lr_flag->count() == 0 &&
      config.min_lr > config.lr) {
    config.min_lr = config.lr / 10;
  }
  // Flags that contradict each other, refused as usage errors before
  // anything is read.
  const auto usage = step_flags_error(app, config);
  if (!usage.empty()) {
    std::cerr << program << ": error: " << usage
              << settings_file_note(usage, sources) << " (see " << program
              << " --help)" << std::endl;
    return kUsageError;
  }
  if (config.precision_support) {
    return guarded_main(
        program,
        [&] {
          print_out("%s", lamp::precision_support(resolve_device(config.device))
                              .to_string()
                              .c_str());
          return 0;
        },
        sources);
  }
  config.command_line.assign(argv, argv + argc);
  config.rank_flags = rank_flag_settings(app);
  // A write beyond `ulimit -f` fails with EFBIG, which the message names,
  // instead of killing the program without one; a closed stdout pipe fails
  // the next print (print_out) instead of ending the run unseen.
  std::signal(SIGXFSZ, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);
  install_stop_signals();
  // Freed tensors' memory serves the next step instead of being faulted in
  // again (include/lamp/platform/host_memory.h).
  lamp::keep_host_memory();
  return guarded_main(
      program,
      [&] {
        config.requested_precision = precision_from(config); // parsed once
        // The ranks meet before any reads a file: a rank that cannot read
        // its data or its copy of the checkpoint (a node without the file)
        // then stops every rank at once, instead of leaving them waiting
        // at the rendezvous until --dist-timeout for a rank that "never
        // came".
        const auto group = join_ranks(config, program);
        if (!group) {
          return 128 + stop_signal();
        }
        // Before anything is read or broadcast: the same flags on every
        // rank.
        check_ranks_agree(*group, config.rank_flags);
        RunSpec spec;
        group->agree("preparing the run", [&] {
          // Before the data is read: a resume that contradicts its
          // checkpoint fails at once.
          const auto* sample_only = app.get_option_no_throw("--sample-only");
          apply_resume_settings(
              app, config, program,
              config.eval_only ? "--eval-only"
              : sample_only != nullptr && sample_only->count() > 0
                  ? "--sample-only"
                  : nullptr);
          if (config.eval_only) {
            TORCH_CHECK(!config.resume.empty() || !config.init_from.empty(),
                        "--eval-only evaluates trained weights: give --resume "
                        "CHECKPOINT (the model's settings come with it) or "
                        "--init-from FILE.");
            refuse_typed_flags(config, training_only_flags(),
                               "--eval-only trains and writes nothing");
          }
          config.logged_flags = run_flag_settings(app, config);
          apply_threads(config);
          spec = make_spec();
          spec.program = program;
          if (!spec.instead_of_training) {
            check_before_training(config, spec, group->is_main());
            check_model_fits(config, spec, group->device());
          }
        });
        if (spec.instead_of_training) {
          return spec.instead_of_training();
        }
        return run(config, spec, group);
      },
      sources);
}

} // namespace lamp_examples
