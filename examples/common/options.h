#pragma once

// The options of train_cifar10 and train_mnist: the flags (declared with
// their defaults, help and checks) and the one translation of them into the
// library's options.

#include <lamp/lamp.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lamp_examples {

/// Every flag the training programs share; the fields' values are the
/// defaults --help shows (each program sets its own before add_options()).
struct ProgramConfig {
  std::string model;
  std::vector<std::string> models; // the valid --model values
  std::string precision = "fp32";
  // --precision (or --fp16) parsed once, after the command line (and a
  // resume's stored value): the mode asked for, kAuto for "auto"; and that
  // mode resolved once for the run's device (run() sets it), which the
  // library, the header line and the log receive.
  lamp::Precision requested_precision = lamp::Precision::kFP32;
  lamp::Precision precision_mode = lamp::Precision::kFP32;
  bool precision_support = false; // print the device's table and exit
  bool fp16 = false;              // the seed's spelling of --precision half
  // --precision fp8's recipe (lamp::nn::Float8Recipe, its defaults).
  std::string fp8_scaling = "current";
  int64_t fp8_amax_history = lamp::nn::Float8Recipe().amax_history_len();
  int64_t fp8_margin = 0;
  bool fp8_fused_casts = false; // Float8Recipe::fused_casts
  int64_t epochs = 10;
  int64_t steps = 0;         // the run's length in steps; 0: --epochs
  int64_t warmup_steps = 0;  // --schedule warmup-cosine's
  bool warmup_given = false; // on the command line
  double min_lr = 0.0;       // --schedule warmup-cosine's floor
  double beta1 = 0.9;        // Adam/AdamW's betas
  double beta2 = 0.999;
  int64_t eval_every = 0;       // evaluate every N steps; 0: after epochs
  int64_t checkpoint_every = 0; // write --checkpoint every N steps too
  int64_t threads = 0;          // intra-op threads; 0: the default
  std::string threads_source;   // where the thread count came from
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
  // train_gpt's --windows: "fixed" (windows that follow each other,
  // shuffled) or "random" (at random offsets: LoaderOptions::random_windows).
  std::string windows = "fixed";
  std::string cuda_graph = "auto";
  std::string fused_bn = "on";
  bool channels_last = false;
  std::string data;
  std::string device; // default: cuda when available, else cpu
  uint64_t seed = 0;
  std::string checkpoint;
  // Whether the run may write `checkpoint` (and its best copy) over an
  // earlier run's (check_earlier_checkpoints()).
  bool overwrite_checkpoint = false;
  std::string export_state_dict;
  std::string resume;
  bool reshard = false; // with resume: another number of ranks
  std::string init_from;
  // A Python state dict the program loaded into its model itself
  // (train_gpt's --init-from of nanoGPT's or GPT-2's weights): init_from is
  // then cleared, and the header names this file instead.
  std::string init_from_python;
  // --eval-only: evaluate --resume's or --init-from's weights on the test
  // set and exit; run() then loads a --resume checkpoint's weights alone,
  // as --init-from does, and trains and writes nothing.
  bool eval_only = false;
  std::string log_json;
  int64_t max_steps = 0;
  int64_t limit_eval_batches = 0; // 0 = the whole test set
  // --eval-train: every evaluation also evaluates the training data, in
  // eval mode (TrainerOptions::eval_train), as nanoGPT's estimate_loss().
  bool eval_train = false;
  // --eval-at-start: with --eval-every, an evaluation before the first step
  // (TrainerOptions::eval_at_start), nanoGPT's step 0.
  bool eval_at_start = false;
  int64_t log_every = 50; // 0: no step records, timed lines off a terminal
  bool progress = true;
  bool report_precision = false;
  bool check_numerics = false;
  double dist_timeout = 600; // seconds a rank waits for the others
  int64_t zero = 0;          // 1: optimizer state sharded over the ranks (ZeRO)
  // The flags the ranks of a data-parallel run compare (rank_check.h), as
  // typed; and the same table after a resume took the checkpoint's values
  // for the flags left out, which the log's run record gives.
  std::vector<std::pair<std::string, std::string>> rank_flags;
  std::vector<std::pair<std::string, std::string>> logged_flags;
  std::vector<std::string> command_line; // for the log's run record
  // Set by the program: flags (with their values) that a command resuming
  // the run leaves out, because --resume refuses them (train_gpt's
  // --train-tokenizer: the checkpoint keeps its tokenizer).
  std::vector<std::string> dropped_on_resume;
  // Set by the program, not a shared flag: tokens per example for a model of
  // sequences (train_gpt's --context), 0 for images. Rates are then tokens/s
  // and the epoch line gives perplexities.
  int64_t sequence_length = 0;
  // Set by the program before add_options(): what one example is, plural,
  // in help texts, messages and the log's field names ("images";
  // train_gpt: "sequences").
  std::string examples = "images";
  // Set by the program: the model's training FLOPs per example (train_gpt:
  // nanoGPT's estimate per sequence), 0 = no MFU; and --peak-tflops, the
  // device's peak where the table (lamp::peak_flops) does not know it.
  double flops_per_example = 0;
  double peak_tflops = 0;
  // Set by run(): the peak MFU is taken against, in FLOP/s (0: unknown, no
  // MFU reported), and where it came from ("NVIDIA H100 80GB HBM3,
  // amp-bf16", "--peak-tflops").
  double peak_flops = 0;
  std::string peak_source;
  // --precision auto: set by apply_resume_settings(), the mode the resumed
  // checkpoint was trained in (kept, not chosen again); set by run(), the
  // line that says what auto chose and why (auto_precision.h).
  std::string auto_stored;
  std::string auto_line;
  // What --resume alone continues of the run's outputs, and what it does
  // not (apply_resume_settings), for a line after the run's first.
  std::string resume_line;
  // Set by the program before add_options(): --data may name a file (a
  // text), not only a folder.
  bool data_may_be_file = false;
  // Set by the program: its own settings that shape the run (train_gpt's
  // model shape and dropout), by flag, as the parsed flags hold them; stored
  // in checkpoints, taken back by --resume and checked.
  std::function<std::vector<lamp::training::ProgramSetting>()> program_settings;
  // Set by apply_resume_settings(): the program settings the resumed
  // checkpoint holds, for the checks a program makes itself.
  std::vector<lamp::training::ProgramSetting> resumed_program_settings;
  // Set by the program: stored settings it takes back itself, from
  // resumed_program_settings, where flags that exclude one another (one
  // prompt of three kinds) cannot each be taken back alone.
  std::vector<std::string> resumed_by_program;
};

/// Binds every shared flag to `config` (defaults are whatever `config` holds).
void add_options(CLI::App& app, ProgramConfig& config);

/// The precision mode --precision (or --fp16) names; kAuto for "auto"
/// (lamp::resolve_precision() turns it into a mode for the device). The
/// programs call it once, into ProgramConfig::requested_precision.
lamp::Precision precision_from(const ProgramConfig& config);

/// Warns (TORCH_WARN, which the programs print as "PROGRAM: warning: ...")
/// about flags that do nothing on `device`: --cudnn-benchmark without CUDA.
/// (--precision tf32 there is the library's warning: TrainStep gives it.)
void warn_ineffective_flags(const ProgramConfig& config,
                            const torch::Device& device);

/// Refuses flags that contradict each other (--fp16 with another
/// --precision, an --fp8-* recipe flag without --precision fp8,
/// --fp8-amax-history without delayed scaling), naming both.
void check_flag_combination(const ProgramConfig& config);

/// The best checkpoint of a run with --checkpoint and --eval-every: the
/// checkpoint's name with ".best" before its extension ("run.pt" ->
/// "run.best.pt", "run" -> "run.best"); "" without either.
std::string best_checkpoint_path(const ProgramConfig& config);

/// The intra-op threads a run uses (--threads, else OMP_NUM_THREADS where
/// set, else the physical cores this process may run on) and where the
/// number came from ("--threads", "OMP_NUM_THREADS", "cores"); sets
/// config.threads and config.threads_source and applies it
/// (at::set_num_threads).
void apply_threads(ProgramConfig& config);

/// The FP8 recipe the --fp8-* flags name.
lamp::nn::Float8Recipe float8_recipe_from(const ProgramConfig& config);

/// Overflowing steps the programs allow at the loss scale's minimum (1)
/// before they stop: GradScalerOptions::min_scale_patience.
constexpr int64_t kMinScalePatience = 20;

/// The one place where the program's options become the library's (with
/// config.precision_mode, the resolved mode): the trainer's, with the training step's (step()) and the optimizer's
/// (optimizer()) nested in them; the trainer's messages name the settings by
/// their flags ("--lr"). `eval_batch_size` is --eval-batch-size capped at the
/// test set; `group` is the run's process group.
lamp::training::TrainerOptions trainer_options_from(
    const ProgramConfig& config, int64_t eval_batch_size,
    std::shared_ptr<lamp::distributed::ProcessGroup> group);

} // namespace lamp_examples
