#include "options.h"

#include "cli.h"
#include "run_flags.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <utility>

namespace lamp_examples {
namespace {

// At most a million epochs: epochs times steps per epoch (the length of the
// learning-rate schedule) then stays far inside int64.
constexpr int64_t kMaxEpochs = 1000000;

// A flag with a value: its check, and its default shown in --help.
template <typename T>
void add_checked(CLI::App& app, const std::string& name, T& field,
                 const std::string& help, const CLI::Validator& check) {
  app.add_option(name, field, help)->check(check)->capture_default_str();
}

// PyTorch Lightning's precision names, taken as lamp's modes: Lightning's
// "-mixed" is autocast (amp, amp-bf16), its "-true" the whole model in that
// dtype (half, bf16). Its plain "bf16" and "16" are not taken: lamp's bf16
// is the whole model in BF16, Lightning's is mixed.
CLI::Validator lightning_precision_names() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        static const std::vector<std::pair<std::string, std::string>> names = {
            {"16-mixed", "amp"}, {"bf16-mixed", "amp-bf16"},
            {"16-true", "half"}, {"bf16-true", "bf16"},
            {"32-true", "fp32"}, {"32", "fp32"}};
        for (const auto& name : names) {
          if (text == name.first) {
            text = name.second;
          }
        }
        return "";
      },
      "");
}

// What is trained, in which precision, for how long, in which batches.
void add_model_options(CLI::App& app, ProgramConfig& c) {
  add_checked(app, "--model", c.model, "network", CLI::IsMember(c.models));
  add_checked(
      app, "--precision", c.precision,
      "fp32 | tf32 | amp | amp-bf16 | half | bf16 (fp16 = half) | fp8 (amp-bf16 with FP8 products in the eligible Linear layers; LibTorch 2.5+) | auto (the fastest mode that keeps fp32's accuracy: on a CPU with native BF16, fp32 or amp-bf16 as timed on this model's first batch; elsewhere the device's rule, which --precision-support shows); Lightning's 16-mixed, bf16-mixed, 16-true, bf16-true, 32-true, 32 name amp, amp-bf16, half, bf16, fp32",
      CLI::IsMember(precision_flag_values()));
  app.get_option("--precision")->transform(lightning_precision_names());
  app.add_flag(
      "--precision-support", c.precision_support,
      "print what each precision mode costs on --device (native, emulated: slower than fp32, or unavailable) and what auto picks, then exit");
  app.add_flag("--fp16", c.fp16, "same as --precision half (the seed's flag)");
  add_checked(
      app, "--fp8-scaling", c.fp8_scaling,
      "with --precision fp8, how each tensor's scale is picked: current (from its own amax at every cast; torchao's default) | delayed (from the amaxes of earlier steps; Transformer Engine's DelayedScaling)",
      CLI::IsMember({"current", "delayed"}));
  add_checked(
      app, "--fp8-amax-history", c.fp8_amax_history,
      "with --fp8-scaling delayed: the steps' amaxes each tensor remembers, the largest of which gives its scale (Transformer Engine's amax_history_len)",
      integer_in(1, 1 << 20));
  add_checked(
      app, "--fp8-margin", c.fp8_margin,
      "with --precision fp8: scale = format max / amax / 2^margin, 2^margin of headroom (Transformer Engine's margin)",
      integer_in(0, 64));
  app.add_flag(
      "--fp8-fused-casts", c.fp8_fused_casts,
      "with --precision fp8: each FP8 cast in one pass over its tensor, on lamp's CUDA kernel (the same bits; a GPU only, ATen's ops elsewhere)");
  add_checked(app, "--epochs", c.epochs,
              "epochs, 1..1000000 (a run measured in passes over the data; "
              "--steps measures it in steps instead)",
              integer_in(1, kMaxEpochs));
  add_checked(
      app, "--steps", c.steps,
      "the run's length in batches (nanoGPT's max_iters times its gradient_accumulation_steps: with --accumulation-steps N, N batches make one optimizer step, and --warmup-steps and --eval-every count batches too); the schedule is sized for it and the last epoch may end inside",
      integer_in(1, int64_t{1} << 40));
  add_checked(app, "--batch-size", c.batch_size,
              c.examples + " per step (at most the training " + c.examples +
                  ", per rank)",
              integer_at_least(1));
  add_checked(app, "--eval-batch-size", c.eval_batch_size,
              c.examples +
                  " per evaluation batch (larger than the test set: the "
                  "whole test set in one batch)",
              integer_at_least(1));
}

// The optimizer, its hyperparameters and the learning-rate schedule.
void add_optimizer_options(CLI::App& app, ProgramConfig& c) {
  add_checked(app, "--optimizer", c.optimizer,
              "sgd | adam | adamw (fused kernels where available)",
              CLI::IsMember(lamp::optim::optimizer_names()));
  add_checked(app, "--lr", c.lr,
              "peak learning rate (e.g. 1e-3 for adam/adamw)", positive_real());
  add_checked(app, "--momentum", c.momentum,
              "SGD momentum (Nesterov), in [0, 1]", real_in(0.0, 1.0));
  add_checked(app, "--weight-decay", c.weight_decay,
              "L2 weight decay (decoupled for adamw)", non_negative_real());
  app.add_flag(
      "--no-bias-decay", c.no_bias_decay,
      "no weight decay on biases and norm parameters (tensors of at most one dimension)");
  add_checked(app, "--max-grad-norm", c.max_grad_norm,
              "clip the gradients' global L2 norm to this (0 = off)",
              non_negative_real());
  add_checked(
      app, "--accumulation-steps", c.accumulation_steps,
      "batches per optimizer step (gradients summed), 1..1048576; must divide the batches per epoch",
      integer_in(1, 1 << 20));
  add_checked(
      app, "--schedule", c.schedule,
      "onecycle | cosine | warmup-cosine (linear warm-up over --warmup-steps, then cosine to --min-lr: nanoGPT's) | constant",
      CLI::IsMember(lamp::training::schedule_table().names()));
  add_checked(app, "--warmup-steps", c.warmup_steps,
              "--schedule warmup-cosine: steps of linear warm-up (a "
              "program's default longer than the run becomes 2% of it)",
              integer_in(0, int64_t{1} << 40));
  add_checked(app, "--min-lr", c.min_lr,
              "--schedule warmup-cosine: the learning rate the cosine decays "
              "toward (the step after the run's last would take it), in [0, "
              "--lr] (a program's default above --lr becomes --lr/10)",
              non_negative_real());
  add_checked(app, "--beta1", c.beta1, "adam/adamw: beta1, in [0, 1)",
              real_in(0.0, 1.0, false, true));
  add_checked(app, "--beta2", c.beta2, "adam/adamw: beta2, in [0, 1)",
              real_in(0.0, 1.0, false, true));
}

// How fast the steps run: cuDNN, CUDA graphs, fixed shapes, memory format.
void add_speed_options(CLI::App& app, ProgramConfig& c) {
  app.add_flag("--cudnn-benchmark", c.cudnn_benchmark,
               "let cuDNN pick its fastest algorithms");
  add_checked(app, "--cudnn-benchmark-limit", c.cudnn_benchmark_limit,
              "algorithms cuDNN's benchmark mode tries per shape (0 = all)",
              integer_in(0, INT_MAX));
  add_checked(
      app, "--cuda-graph", c.cuda_graph,
      "capture the training step in CUDA graphs: auto (where they apply: CUDA, fused optimizer, no accumulation, one process; the reason is printed where not), on (refuse a run where they cannot), off",
      CLI::IsMember(lamp::cuda_graph_mode_table().names()));
  add_checked(
      app, "--drop-last", c.drop_last,
      "drop the last partial training batch: auto (on CUDA, where a new shape means autotuning and a new graph), on, off",
      CLI::IsMember({"auto", "on", "off"}));
  app.add_flag("--channels-last", c.channels_last,
               "NHWC memory format for images and model");
  add_checked(
      app, "--fused-bn", c.fused_bn,
      "BatchNorm with its ReLU (and residual add) as one cuDNN kernel: on (where it applies: CUDA, --channels-last, half/bf16 activations, training), off (the stock ops everywhere), conv (opt-in: the ResNet blocks' BatchNorms folded into their convolutions through cuDNN's graph API where it applies, 'on' elsewhere)",
      CLI::IsMember({"on", "off", "conv"}));
}

// Where the run reads and writes: data, device, seed, checkpoints, exported
// weights.
void add_input_output_options(CLI::App& app, ProgramConfig& c) {
  const bool text = c.data_may_be_file;
  add_checked(
      app, "--data", c.data,
      text ? "a text file, or a folder of them, or a folder of token files "
             "(nanoGPT's train.bin, val.bin and meta.pkl)"
           : "dataset directory",
      CLI::Validator(
          [text](std::string& value) -> std::string {
            if (value.empty()) {
              return text ? "the name is empty; give a text file or a folder "
                            "of them"
                          : "the folder name is empty; give the dataset folder";
            }
            struct stat st {};
            if (!text && ::stat(value.c_str(), &st) == 0 &&
                !S_ISDIR(st.st_mode)) {
              return value +
                     " is a file, not a folder; give the folder that holds "
                     "the dataset's files (an archive must be extracted "
                     "first)";
            }
            return "";
          },
          text ? "PATH" : "DIR"));
  app.add_option("--device", c.device,
                 "cpu, cuda or cuda:N (default: cuda when available)");
  add_checked(app, "--seed", c.seed,
              "seed of initialisation, data order and augmentation",
              unsigned_integer());
  app.add_option(
         "--checkpoint", c.checkpoint,
         "write a checkpoint here after every epoch, every --checkpoint-every steps, at the run's end and when a signal stops it (with --eval-every also the best one, named with .best before the extension)")
      ->check(non_empty_path("the file to write the checkpoint to"));
  app.add_flag(
      "--overwrite-checkpoint", c.overwrite_checkpoint,
      "let a run write --checkpoint (and its best copy) over an earlier run's; without it a run refuses to start where they exist, unless it resumes that checkpoint (--resume)");
  add_checked(
      app, "--checkpoint-every", c.checkpoint_every,
      "also write --checkpoint every N steps, inside epochs (0 = after epochs only); a resume from it continues bit for bit",
      integer_at_least(0));
  app.add_option(
         "--export-state-dict", c.export_state_dict,
         "after training, write the weights here as a Python state_dict (FP32) for torch.load + model.load_state_dict")
      ->check(non_empty_path("the file to write the weights to"));
  auto* resume =
      app.add_option(
             "--resume", c.resume,
             "resume from this checkpoint (with more --epochs, or more --steps for a run of --steps: continue a finished --schedule constant run)")
          ->check(non_empty_path("the checkpoint to resume from"));
  app.add_flag(
         "--reshard", c.reshard,
         "with --resume: accept a checkpoint of another number of ranks and go on with this one (the optimizer state re-sharded, the data split anew: another global batch)")
      ->needs(resume);
  app.add_option(
         "--init-from", c.init_from,
         "start a new run from this checkpoint's weights alone (fine-tuning: no optimizer state or position; the model must match)")
      ->check(non_empty_path("the checkpoint whose weights to start from"))
      ->excludes(resume);
  app.add_flag(
      "--eval-only", c.eval_only,
      "evaluate --resume's checkpoint or --init-from's weights on the test set (train_gpt: the validation tokens; --data may be another) in --precision, print the loss and accuracy and exit, training and writing nothing (nanoGPT's eval_only)");
  add_checked(
      app, "--dist-timeout", c.dist_timeout,
      "under torchrun: seconds a rank waits for the others (rendezvous, each collective) before it stops with an error naming the ranks it waited for",
      real_in(0.001, 86400.0 * 7));
  add_checked(
      app, "--zero", c.zero,
      "under torchrun: 1 shards the FP32 master weights and optimizer state over the ranks (ZeRO stage 1: each rank keeps 1/N; the checkpoint is then one file per rank), 2 also reduce-scatters the gradients into the shards (stage 2: no whole gradient kept), 0 keeps them whole on every rank",
      integer_in(0, 2));
}

// What the run reports while it trains, and when it stops early.
void add_report_options(CLI::App& app, ProgramConfig& c) {
  app.add_option(
         "--log-json", c.log_json,
         "append JSON Lines records to this file: a run header, one per epoch, one per --log-every steps")
      ->check(non_empty_path("the file to append the records to"));
  add_checked(
      app, "--log-every", c.log_every,
      "every N steps print a progress line (and with --log-json write a step record, so that scripts/plot.py draws curves within epochs); 0 = no step records, a line every 30 s when the output is not a terminal",
      integer_at_least(0));
  add_checked(app, "--max-steps", c.max_steps,
              "stop after this many steps, 0 = no limit (smoke runs)",
              integer_at_least(0));
  add_checked(
      app, "--eval-every", c.eval_every,
      "evaluate every N steps (nanoGPT's eval_interval) and at the run's end, instead of after every epoch; 0 = after every epoch",
      integer_at_least(0));
  add_checked(
      app, "--limit-eval-batches,--eval-batches", c.limit_eval_batches,
      "evaluate only the first N test batches, 0 = all (quick checks; the accuracy is then over that subset, which the epoch line and log say)",
      integer_at_least(0));
  app.add_flag(
      "--eval-train", c.eval_train,
      "every evaluation also evaluates the training data, in eval mode (no dropout or augmentation) over as many batches as the test set's (--eval-batches), the same examples every time, as nanoGPT's estimate_loss(): a training loss that compares with the test loss");
  app.add_flag(
      "--eval-at-start", c.eval_at_start,
      "with --eval-every, also evaluate before the first step, as nanoGPT's step 0: the untrained model (a language model's loss near ln(vocabulary)), or a resumed run's weights as loaded; it writes no checkpoint and is not counted as the best");
  add_checked(
      app, "--threads", c.threads,
      "intra-op CPU threads (0 = OMP_NUM_THREADS where set, else the physical cores this process may use)",
      integer_in(0, 4096));
  app.add_flag_callback(
      "--no-progress", [&c] { c.progress = false; },
      "no progress bar or timed progress lines");
  app.add_flag(
      "--report-precision", c.report_precision,
      "before training, print every parameter's and buffer's dtype and the dtypes of the convolutions/matmuls of one evaluation pass");
  // Numerics debugging.
  app.add_flag(
      "--check-numerics", c.check_numerics,
      "check every step's forward outputs and gradients: stop at the first module whose values are inf/NaN or, in FP16, above half of its range, naming it (eager steps, slower)");
}

// How the library's messages name a setting: by its flag where the programs
// have one ("batch_size" -> "--batch-size"), else by the library's name.
std::string flag_name(const std::string& key, const std::string& library_name) {
  if (key == "num_shards") {
    return "torchrun --nproc_per_node"; // the shards are the ranks
  }
  if (key == "best_checkpoint") {
    return "--checkpoint's best copy (with --eval-every)";
  }
  for (const auto& row : run_flags()) {
    if (key == row.key) {
      return row.flag;
    }
  }
  return library_name;
}

} // namespace

void add_options(CLI::App& app, ProgramConfig& config) {
  // --help lists the flags in this order.
  add_model_options(app, config);
  add_optimizer_options(app, config);
  add_speed_options(app, config);
  add_input_output_options(app, config);
  add_report_options(app, config);
}

lamp::Precision precision_from(const ProgramConfig& config) {
  return lamp::parse_precision(config.fp16 ? std::string("half")
                                           : config.precision);
}

void warn_ineffective_flags(const ProgramConfig& config,
                            const torch::Device& device) {
  if (device.is_cuda()) {
    return;
  }
  if (config.cudnn_benchmark) {
    TORCH_WARN("--cudnn-benchmark has no effect on ", device,
               ": cuDNN is a CUDA library; leave the flag out.");
  }
}

void check_flag_combination(const ProgramConfig& config) {
  TORCH_CHECK(!config.fp16 || config.precision == "fp32" ||
                  config.precision == "half" || config.precision == "fp16",
              "--fp16 and --precision ", config.precision,
              " contradict each other; give one of them.");
  const ProgramConfig defaults;
  const bool recipe_given =
      config.fp8_scaling != defaults.fp8_scaling ||
      config.fp8_amax_history != defaults.fp8_amax_history ||
      config.fp8_margin != defaults.fp8_margin;
  TORCH_CHECK(!recipe_given || (config.precision == "fp8" && !config.fp16),
              "--fp8-scaling, --fp8-amax-history and --fp8-margin set the "
              "recipe of --precision fp8, not of --precision ",
              config.fp16 ? std::string("half") : config.precision,
              "; add --precision fp8 or leave them out.");
  TORCH_CHECK(
      !config.fp8_fused_casts || (config.precision == "fp8" && !config.fp16),
      "--fp8-fused-casts applies to --precision fp8, not to "
      "--precision ",
      config.fp16 ? std::string("half") : config.precision,
      "; add --precision fp8 or leave it out.");
  TORCH_CHECK(config.fp8_scaling == "delayed" ||
                  config.fp8_amax_history == defaults.fp8_amax_history,
              "--fp8-amax-history ", config.fp8_amax_history,
              " applies to --fp8-scaling delayed (current scaling keeps no "
              "history); add --fp8-scaling delayed or leave it out.");
}

std::string best_checkpoint_path(const ProgramConfig& config) {
  // Sharded checkpoints keep one copy (TrainerOptions::best_checkpoint).
  if (config.checkpoint.empty() || config.eval_every == 0 || config.zero > 0) {
    return "";
  }
  const auto& path = config.checkpoint;
  const auto slash = path.rfind('/');
  const auto dot = path.rfind('.');
  const bool has_extension = dot != std::string::npos && dot > 0 &&
                             (slash == std::string::npos || dot > slash + 1);
  return has_extension ? path.substr(0, dot) + ".best" + path.substr(dot)
                       : path + ".best";
}

void apply_threads(ProgramConfig& config) {
  config.threads = use_threads(config.threads, &config.threads_source);
}

lamp::nn::Float8Recipe float8_recipe_from(const ProgramConfig& config) {
  return lamp::nn::Float8Recipe()
      .scaling(config.fp8_scaling == "delayed"
                   ? lamp::nn::Float8Scaling::kDelayed
                   : lamp::nn::Float8Scaling::kCurrent)
      .amax_history_len(config.fp8_amax_history)
      .margin(config.fp8_margin)
      .fused_casts(config.fp8_fused_casts);
}

lamp::training::TrainerOptions trainer_options_from(
    const ProgramConfig& config, int64_t eval_batch_size,
    std::shared_ptr<lamp::distributed::ProcessGroup> group) {
  const bool warmup_cosine = config.schedule == "warmup-cosine";
  auto options =
      lamp::training::TrainerOptions(config.precision_mode)
          .epochs(config.epochs)
          .steps(config.steps)
          .schedule(lamp::training::parse_schedule(config.schedule))
          // A program's defaults for warmup-cosine (train_gpt's)
          // shape no other schedule.
          .warmup_steps(warmup_cosine ? config.warmup_steps : 0)
          .min_lr(warmup_cosine ? config.min_lr : 0.0)
          .eval_every(config.eval_every)
          // A program's default period applies where there
          // is a checkpoint to write.
          .checkpoint_every(config.checkpoint.empty() ? 0
                                                      : config.checkpoint_every)
          .best_checkpoint(best_checkpoint_path(config))
          .eval_batch_size(eval_batch_size)
          .max_steps(config.max_steps)
          .limit_eval_batches(config.limit_eval_batches)
          .eval_train(config.eval_train)
          .eval_at_start(config.eval_at_start)
          .checkpoint(config.checkpoint)
          .resume(config.resume)
          .reshard(config.reshard)
          .init_from(config.init_from)
          .process_group(std::move(group))
          .zero_stage(static_cast<int>(config.zero))
          .check_numerics(config.check_numerics)
          .option_name(flag_name);
  if (config.precision_mode == lamp::Precision::kFP8) {
    options.step().float8(float8_recipe_from(config));
  }
  options.step()
      .cuda_graph(lamp::parse_cuda_graph_mode(config.cuda_graph))
      .max_grad_norm(config.max_grad_norm)
      .accumulation_steps(config.accumulation_steps);
  // A scale that cannot back off below 1 and keeps overflowing there: the
  // gradients overflow FP16 unscaled; stop instead of skipping on.
  options.step().scaler().min_scale(1.0).min_scale_patience(kMinScalePatience);
  options.optimizer()
      .name(config.optimizer)
      .lr(config.lr)
      .momentum(config.momentum)
      .weight_decay(config.weight_decay)
      .no_bias_decay(config.no_bias_decay)
      .beta1(config.beta1)
      .beta2(config.beta2);
  // The program's own settings, and where the data is: --resume alone
  // finds it again (its contents are checked by fingerprint, not its path).
  auto program = config.program_settings
                     ? config.program_settings()
                     : std::vector<lamp::training::ProgramSetting>{};
  // Unchecked: a resume may change them, and --resume alone keeps them.
  program.push_back({"--data", config.data, /*checked=*/false});
  program.push_back({"--eval-every", std::to_string(config.eval_every), false});
  program.push_back({"--limit-eval-batches",
                     std::to_string(config.limit_eval_batches), false});
  // With --limit-eval-batches, the batch size picks the evaluated examples:
  // another one would score another subset and start the best afresh.
  program.push_back(
      {"--eval-batch-size", std::to_string(config.eval_batch_size), false});
  program.push_back(
      {"--eval-train", config.eval_train ? "true" : "false", false});
  program.push_back(
      {"--eval-at-start", config.eval_at_start ? "true" : "false", false});
  program.push_back(
      {"--checkpoint-every", std::to_string(config.checkpoint_every), false});
  // Where the run writes, for --resume alone to continue (resume_settings).
  program.push_back({"--checkpoint", config.checkpoint, false});
  program.push_back({"--log-json", config.log_json, false});
  options.program_settings(std::move(program));
  return options;
}

} // namespace lamp_examples
