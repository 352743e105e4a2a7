#pragma once

/// \file
/// The training loop of lamp's programs, for users' classifiers and
/// language models too: a TrainStep, a DeviceLoader, a task (Task: what is
/// predicted and scored), a learning-rate schedule, evaluation, checkpoints
/// that resume exactly.

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lamp/amp/numerics_check.h"
#include "lamp/amp/precision.h"
#include "lamp/amp/train_step.h"
#include "lamp/data/datasets.h"
#include "lamp/data/loader.h"
#include "lamp/distributed/process_group.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/training/schedule.h"
#include "lamp/training/task.h"

namespace lamp {
namespace training {

/// Names a setting in a message: (key, library name) -> the name to print.
using OptionNamer = std::function<std::string(const std::string& key,
                                              const std::string& library_name)>;

/// A setting of the program around the trainer (TrainerOptions::
/// program_settings): its name as the program's messages show it
/// ("--layers"), its value as text, and whether a resumed run must repeat
/// it (a path to the data need not: the data's contents are checked).
struct ProgramSetting {
  std::string name;    ///< as the program's messages show it: "--layers"
  std::string value;   ///< as text: "6", "0.2", "data/input.txt"
  bool checked = true; ///< whether a resume must repeat it
};

/// Options of Trainer. The step's and the optimizer's options are
/// nested, not copied: `step` is a TrainStepOptions (precision, accumulation,
/// clipping, skip_non_finite, CUDA graphs, the scaler's options) and
/// `optimizer` an optim::OptimizerOptions (name, lr, momentum, weight decay,
/// ...), each with its own defaults. Example:
///
/// \code
/// auto options = lamp::training::TrainerOptions(lamp::Precision::kAMPBF16)
///                    .epochs(5)
///                    .checkpoint("run.pt");
/// options.optimizer().lr(0.05);
/// options.step().max_grad_norm(1.0);
/// \endcode
struct TrainerOptions {
  /// Options for `precision`; the step runs CUDA graphs where they apply
  /// (cuda_graph kAuto, where TrainStepOptions alone defaults to kOff).
  /* implicit */ TrainerOptions(Precision precision = Precision::kFP32)
      : step_(TrainStepOptions(precision).cuda_graph(CudaGraphMode::kAuto)) {}

  /// The training step: precision, accumulation_steps (batches whose
  /// gradients are summed before one optimizer step; it must divide the
  /// batches per epoch, so that every epoch and checkpoint ends on an
  /// optimizer step; steps, max_steps and the schedule count batches),
  /// max_grad_norm, skip_non_finite, cuda_graph (kAuto here: CUDA graphs on
  /// CUDA with a fused lamp::optim optimizer, no accumulation, one process;
  /// train_step().cuda_graph_enabled() and cuda_graph_unavailable_reason()
  /// say what was chosen and why) and the scaler's options. Its
  /// gradient_sync is the trainer's to set (from `process_group`).
  TORCH_ARG(TrainStepOptions, step);
  /// The optimizer, built by optim::make_optimizer(); `lr` is the peak of the
  /// schedule.
  TORCH_ARG(optim::OptimizerOptions, optimizer);
  /// What the model predicts and how it is scored: a class per example
  /// (Task::classification(), the default) or the next token at every
  /// position (Task::language_model()). The loaders' data must fit it
  /// (Task::check()).
  TORCH_ARG(Task, task) = Task::classification();
  /// Passes over the training data.
  TORCH_ARG(int64_t, epochs) = 10;
  /// The run's length in steps (batches; nanoGPT's `max_iters`), 0 = the
  /// whole `epochs`. Where set, the schedule is sized for it and the run ends
  /// after it, inside an epoch where it is not a whole number of epochs (the
  /// last epoch is then partial() and its checkpoint holds that step); it
  /// must be at most `epochs` times the batches per epoch (a program sets
  /// `epochs` from it, as lamp's programs do for --steps) and a multiple of
  /// the accumulation steps.
  TORCH_ARG(int64_t, steps) = 0;
  /// How the learning rate moves from step to step.
  TORCH_ARG(Schedule, schedule) = Schedule::kOneCycle;
  /// Schedule::kWarmupCosine's linear warm-up, in steps (must be shorter
  /// than the run); 0 for the other schedules.
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Schedule::kWarmupCosine's floor, in [0, lr], which the cosine reaches
  /// at step `total_steps` (one past the run's last step, which is a hair
  /// above it; warmup_cosine_lr()); 0 for the other schedules.
  TORCH_ARG(double, min_lr) = 0.0;
  /// Stop after this many steps (batches; with accumulation_steps N, N of
  /// them make one optimizer step) in total (0 = no limit): smoke runs.
  /// Unlike `steps` it does not resize the schedule: a run stopped here and
  /// resumed follows the learning rates of the whole run.
  TORCH_ARG(int64_t, max_steps) = 0;
  /// Evaluate every this many steps (counted over the whole run, as
  /// nanoGPT's `eval_interval`), and at the run's end; 0 = after every
  /// epoch instead. The evaluations go to fit()'s `on_evaluation`, and the
  /// epochs then end without one (EpochStats::evaluated false). With
  /// `best_checkpoint`, each evaluation that improves the lowest test loss
  /// writes it.
  TORCH_ARG(int64_t, eval_every) = 0;
  /// Write `checkpoint` every this many steps as well as after every epoch
  /// (0 = after epochs only). A checkpoint written inside an epoch holds the
  /// position in it: a resume continues at the next step, with the same
  /// data, the same random numbers and the same weights, to the bit, as the
  /// run that went straight on. One whose step's loss was inf/NaN is not
  /// written (nor the one at a stop_requested stop), with a warning: the
  /// file keeps the last good one until an evaluation or the epoch's check
  /// decides whether the run has diverged.
  TORCH_ARG(int64_t, checkpoint_every) = 0;
  /// With `eval_every`: a second checkpoint, written (atomically, as
  /// `checkpoint`) after each evaluation whose test loss is the lowest of
  /// the run so far; it resumes like `checkpoint`. Empty = none. It must
  /// be another file than `checkpoint` and `init_from` (compared as files:
  /// "./run.pt" is "run.pt").
  TORCH_ARG(std::string, best_checkpoint) = "";
  /// Settings of the program that shape the run beyond the trainer's own (a
  /// model's shape and dropout, the data's path): stored in checkpoints
  /// (read back by read_checkpoint_settings()) and, where `checked`,
  /// compared on resume like the trainer's settings, every difference named
  /// in one message.
  TORCH_ARG(std::vector<ProgramSetting>, program_settings) = {};
  /// Examples (images, sequences) per evaluation batch.
  TORCH_ARG(int64_t, eval_batch_size) = 1000;
  /// Evaluate only the first this many test batches (0 = all; more than the
  /// test set has = all), for quick checks, as Lightning's
  /// `limit_val_batches`. The test loss and accuracy are then over that
  /// subset, which EpochStats::test_batches and test_batches_in_set say.
  /// Not stored in checkpoints (a resumed run may evaluate more or fewer
  /// batches: its first evaluation of another subset then starts the best
  /// test loss afresh); with a process group the ranks must agree on it, and
  /// rank r
  /// evaluates batches r, r + ranks, ... of the first limit_eval_batches.
  TORCH_ARG(int64_t, limit_eval_batches) = 0;
  /// Each evaluation also evaluates the training data, as nanoGPT's
  /// `estimate_loss()` does: in eval mode (no dropout) and without
  /// augmentation, so that its loss compares with the test loss where the
  /// running training loss (measured in train mode, on augmented batches)
  /// does not. Over as many batches of eval_batch_size as the test set's
  /// evaluation (limit_eval_batches; the whole training data when 0), drawn
  /// once from the training loader's seed: the same examples (or, with
  /// LoaderOptions::random_windows, the same windows at random offsets)
  /// every evaluation, from all of the data rather than its start. Results
  /// in EpochStats::train_evaluation and StepEvaluation::train_evaluation;
  /// its time is in their eval_seconds. Not stored in checkpoints.
  TORCH_ARG(bool, eval_train) = false;
  /// With `eval_every`: also evaluate before the run's first step, as
  /// nanoGPT's step 0 does (a fresh run's untrained model, whose loss a
  /// language model's should be near ln(vocabulary); a resumed run's
  /// weights as loaded). It goes to fit()'s `on_evaluation` with
  /// StepEvaluation::before_training set: no training loss (NaN), and it
  /// writes no checkpoint and does not count as the best test loss.
  TORCH_ARG(bool, eval_at_start) = false;
  /// Write a checkpoint here after every complete epoch; empty = none. The
  /// write is atomic and durable and the file checksummed
  /// (checkpoint_file.h); the path is locked against other runs for the
  /// trainer's lifetime, and checked (folder writable, not a device or FIFO)
  /// before training.
  TORCH_ARG(std::string, checkpoint) = "";
  /// Resume from this checkpoint; empty = start fresh. The run repeats the
  /// checkpoint's settings, except that it may give more `epochs` where the
  /// schedule allows it (Schedule::kConstant, see depends_on_length()):
  /// the finished run then continues, recorded in history().
  TORCH_ARG(std::string, resume) = "";
  /// Start a new run from this checkpoint's weights alone (fine-tuning):
  /// the parameters and buffers, from the FP32 master weights where that
  /// run kept them, but no optimizer state, scaler or position, so the
  /// schedule, learning rate, epochs and even the precision are this run's
  /// own (load_weights_from_checkpoint(); the model must have the same
  /// tensors, by name and shape). Empty = the model's own initialisation.
  /// Excludes `resume`.
  TORCH_ARG(std::string, init_from) = "";
  /// Abort when this many consecutive optimizer steps were skipped for
  /// non-finite gradients, or the loss stayed non-finite this long, counted
  /// across epochs. (An epoch whose mean loss or weights are not finite ends
  /// the run whatever its length.)
  TORCH_ARG(int64_t, divergence_patience) = 100;
  /// Observe every training step with a lamp::NumericsCheck: the first
  /// module whose output or gradient holds inf/NaN, or FP16 values above
  /// half of FP16's range, stops training with an error naming it, its type,
  /// the dtype, the step, the direction and the largest magnitude (see
  /// numerics_check.h; under dynamic loss scaling an overflowing gradient is
  /// the scaler's to skip, and only remembered for the divergence messages).
  /// The steps then run eagerly (cuda_graph kAuto becomes kOff; kOn is
  /// refused) and slower: see docs/training.md for the cost. Off:
  /// divergence errors still name the first module, by re-running the last
  /// batch's forward and backward under the check (no optimizer step;
  /// gradients and buffers restored) when they stop the run.
  TORCH_ARG(bool, check_numerics) = false;
  /// Data-parallel training (lamp/distributed.h): each rank trains on its
  /// shard of the training data (give the train loader
  /// LoaderOptions::num_shards/shard), gradients are averaged over the
  /// ranks, evaluation is split over the ranks and summed, train loss and
  /// examples/s are reported for all ranks together, and only rank 0 writes
  /// the checkpoint. Before anything is broadcast, the ranks compare their
  /// settings (those a checkpoint stores, the data's fingerprints, the
  /// evaluation batch size, max_steps, limit_eval_batches, whether a
  /// checkpoint, a resume and an init_from are given) and, after a resume,
  /// the epoch and step they resume at; a difference stops every rank naming
  /// it with each rank's value. nullptr or a one-process group: a single
  /// process.
  TORCH_ARG(std::shared_ptr<distributed::ProcessGroup>,
            process_group) = nullptr;
  /// Shard the optimizer state over the ranks of `process_group`
  /// (distributed::DataParallelOptions::zero_stage): 0 keeps it whole on
  /// every rank, 1 keeps 1/N of the FP32 master weights and optimizer state
  /// on each (ZeRO stage 1), 2 also reduce-scatters the gradients into the
  /// shards instead of averaging them whole (stage 2). Sharded, every rank
  /// writes its shard of the
  /// checkpoint: rank 0 the checkpoint itself (the manifest: settings,
  /// history, model, its own shard, and the names of the others' files),
  /// rank r > 0 the file `checkpoint` + ".rank<r>-of-<N>.step<S>" (S the
  /// global step), each checked and written atomically as the checkpoint
  /// is; the manifest is written last and the previous shard files removed
  /// after it, so that a run stopped at any point leaves a complete
  /// checkpoint. A resume needs the same zero_stage and number of ranks
  /// (or `reshard`), and refuses a missing, damaged or mismatched shard
  /// file on every rank, naming the rank and the file. A one-process group
  /// shards over its one rank; without a group the state is whole.
  TORCH_ARG(int, zero_stage) = 0;
  /// With `resume`: accept a checkpoint written by another number of ranks.
  /// Each rank then reads every rank's shard file and takes its own part of
  /// the optimizer state, cut anew (TrainStep::load_resharded; a whole
  /// state is loaded as it is), and training goes on at the checkpoint's
  /// next epoch with this run's split of the data. That changes the global
  /// batch (the per-rank batch size stays) and the order of the samples,
  /// so the run is not the one the original ranks would have made; the
  /// step count and the schedule's position restart from the epoch
  /// (epoch x this run's steps per epoch), and history() records the
  /// change. Off: another number of ranks is refused.
  TORCH_ARG(bool, reshard) = false;
  /// How the trainer's messages name a setting, given its key ("lr",
  /// "batch_size", "precision", "optimizer", "model", "data", ...) and the
  /// library's name for it ("TrainerOptions::optimizer().lr"). Unset: the
  /// library's name. A program passes its flags' names ("--lr").
  TORCH_ARG(OptionNamer, option_name) = nullptr;
  /// Asked before every training step that starts an accumulation cycle
  /// (every step without accumulation) and every evaluation batch of fit():
  /// when it returns true, fit() stops there, at a step boundary, and
  /// returns (Trainer::stop_point() says where). With `checkpoint`
  /// it is written at the step it stopped on, unless the file already holds
  /// that step, so that nothing trained is lost. In a data-parallel run the
  /// ranks stop together, at the same step, when any of them is asked: a
  /// true answer is kept until the ranks check, in one all-reduce of the
  /// answers, at the next cycle's start (on a CUDA group at every 32nd
  /// cycle, where reading the answer waits for the GPU); in an evaluation
  /// at one turn of the ranks' batches (each rank takes as many turns as
  /// the one with the most), checking at the turns the ranks agree on:
  /// about every 0.1 s of evaluation, at most every 256th turn (every 32nd
  /// on a CUDA group). The programs set it from SIGINT/SIGTERM: make it
  /// cheap and async-signal-safe to feed (read a flag a signal handler
  /// sets). Unset: fit() runs to the end.
  TORCH_ARG(std::function<bool()>, stop_requested) = nullptr;
  /// The training step's loss from the inputs and targets, in place of
  /// `task().loss(forward(inputs), targets)`: a model that computes its
  /// head and loss together (models::GPTImpl::loss() with
  /// GPTOptions::fused_head_loss, which never holds the whole batch's
  /// logits). It must compute that loss (an FP32 mean); it runs inside the
  /// step, under its autocast. The evaluation still uses the forward and
  /// task().loss(). Unset: the task's loss of the forward.
  TORCH_ARG(
      std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>,
      training_loss) = nullptr;
};

/// Where fit() stopped when TrainerOptions::stop_requested asked it to.
struct StopPoint {
  /// Whether fit() (or Trainer::evaluate_unless_stopped()) stopped early on
  /// request.
  bool stopped = false;
  /// The epoch it stopped in (1-based).
  int64_t epoch = 0;
  /// The training steps of that epoch done, of steps_in_epoch (those before
  /// a resume inside it included).
  int64_t steps = 0;
  /// The training steps the epoch has in all.
  int64_t steps_in_epoch = 0;
  /// It stopped during an evaluation (the epoch's, or one of
  /// TrainerOptions::eval_every): the steps before it were trained. One of
  /// eval_every's is pending in the checkpoint: the resumed run runs it
  /// first (its StepEvaluation, the best checkpoint and the training loss
  /// of the steps since the one before, as the straight run's). The epoch's
  /// is not: the resumed run starts the next epoch, and --eval-only (or
  /// evaluate()) of the checkpoint gives its test loss.
  bool in_evaluation = false;
  /// The steps trained in all, this run's and those resumed from.
  int64_t global_step = 0;
  /// The global step TrainerOptions::checkpoint holds after the stop (-1:
  /// no checkpoint given, or none written or resumed from in this run).
  int64_t checkpoint_step = -1;
  /// The rank whose stop_requested asked for the stop (in a data-parallel
  /// run the highest of those that did; 0 in a single process), or -1
  /// where none did.
  int asked_by_rank = -1;
};

/// Cross-entropy, FP32, of `output` against `labels`, as a mean (`sum`
/// false) or a sum over every label: `output` [N, classes] logits or
/// log-probabilities for labels [N], or [N, T, classes] for labels [N, T]
/// (a class per position); any dtype, computed in FP32. The trainer scores
/// through its Task (Task::loss()), which checks the shapes against the
/// task.
torch::Tensor classifier_loss(const torch::Tensor& output,
                              const torch::Tensor& labels, bool sum = false);

/// How many of `labels` ([N] or [N, T]) `output` ([N, classes] or
/// [N, T, classes]) ranks first: a 0-dim int64 tensor on their device.
torch::Tensor classifier_correct(const torch::Tensor& output,
                                 const torch::Tensor& labels);

/// The name a message of `options`' trainer uses for setting `key`, whose
/// library name is `library_name`: options.option_name()'s answer, or
/// `library_name` when it is unset.
std::string name_option(const TrainerOptions& options, const std::string& key,
                        const std::string& library_name);

/// One change of course in a run's life, as its checkpoints record it
/// (Trainer::history()), oldest first.
struct RunHistoryEntry {
  /// "continued": resumed with more epochs than it was given (a constant
  /// schedule); "init_from": started from the weights of another run's
  /// checkpoint (TrainerOptions::init_from); "resharded": resumed on
  /// another number of ranks (TrainerOptions::reshard).
  std::string kind;
  /// Complete epochs when it happened: where the continuation began; 0 for
  /// "init_from".
  int64_t at_epoch = 0;
  /// "continued": the epochs the run was given before; "init_from": the
  /// complete epochs of the run whose weights it started from.
  int64_t previous_epochs = 0;
  /// The epochs the run was given from then on.
  int64_t epochs = 0;
  /// "init_from": the checkpoint's path as given; empty otherwise.
  std::string source;
  /// "resharded" (resumed on another number of ranks,
  /// TrainerOptions::reshard): the ranks before; 0 otherwise.
  int64_t previous_ranks = 0;
  /// "resharded": the ranks after; 0 otherwise.
  int64_t ranks = 0;
};

/// What one evaluation measured (Trainer::evaluate_subset(), and
/// Trainer::evaluate_training_data() of TrainerOptions::eval_train).
struct Evaluation {
  /// Mean cross-entropy per prediction evaluated (per example; per token
  /// for a language model).
  double loss = 0;
  double accuracy = 0; ///< in [0, 1], of the predictions evaluated
  /// Batches evaluated (all ranks), the test set's batches, examples
  /// evaluated: see EpochStats::test_batches.
  int64_t batches = 0;
  int64_t batches_in_set = 0; ///< see `batches`
  int64_t examples = 0;       ///< see `batches`
  /// The predictions evaluated: `examples`, or for a language model its
  /// tokens.
  int64_t predictions = 0;
  /// exp(loss) (perplexity()).
  double perplexity() const { return training::perplexity(loss); }
};

/// What one epoch did.
struct EpochStats {
  int64_t epoch = 0; ///< 1-based
  int64_t steps = 0; ///< optimizer steps in this epoch, in this run
  /// Steps of this epoch trained before the run resumed it from a
  /// checkpoint written inside it (TrainerOptions::checkpoint_every, or a
  /// stop); 0 otherwise. `train_loss` covers them too.
  int64_t resumed_steps = 0;
  /// The steps of a whole epoch; more than resumed_steps + steps when
  /// max_steps or TrainerOptions::steps ended the run inside it (partial()).
  int64_t steps_in_epoch = 0;
  int64_t global_step = 0; ///< optimizer steps so far, all epochs
  /// Mean training loss over the steps whose loss was finite: a mean of the
  /// steps' mean losses (as nanoGPT's), so that a short last batch
  /// (drop_last false) weighs as much as a full one.
  double train_loss = 0;
  /// Steps whose loss was inf/NaN (skipped by loss scaling or
  /// skip_non_finite; a run of them stops training, see Trainer).
  int64_t non_finite_losses = 0;
  /// Mean cross-entropy per prediction evaluated (per example; per token
  /// for a language model), after the epoch.
  double test_loss = 0;
  /// In [0, 1], over the predictions evaluated (Task::accuracy_name():
  /// accuracy, or next-token accuracy).
  double test_accuracy = 0;
  /// The evaluation batches `test_loss` and `test_accuracy` are over (all
  /// ranks together), the test set's batches, and the examples evaluated:
  /// test_batches < test_batches_in_set where limit_eval_batches evaluated
  /// a subset (test_subset()).
  int64_t test_batches = 0;
  int64_t test_batches_in_set = 0; ///< see `test_batches`
  int64_t test_examples = 0;       ///< see `test_batches`
  /// TrainerOptions::eval_train: the training data's evaluation beside the
  /// test set's; none without it or where `evaluated` is false.
  c10::optional<Evaluation> train_evaluation;
  /// Training time of the epoch (no evaluation, no checkpoint written inside
  /// it), without `warmup_seconds`.
  double seconds = 0;
  /// The first epoch of a run: the time of its first training step (with
  /// CUDA graphs: its eager warm-up steps and the capture), where cuDNN
  /// autotunes (benchmark mode) and caches warm up; 0 in later epochs.
  /// Reported apart so that `seconds` and examples/s are the steady rate.
  /// Evaluation is in neither (see `eval_seconds`).
  double warmup_seconds = 0;
  /// The evaluation's time after the epoch (the first one of a run includes
  /// autotuning for the evaluation shapes), or with
  /// TrainerOptions::eval_every that of the evaluations inside it, which
  /// `seconds` leaves out.
  double eval_seconds = 0;
  /// The time of the checkpoints written inside the epoch (checkpoint_every,
  /// eval_every's best and regular ones), which `seconds` leaves out; the
  /// one written at its end is after it.
  double checkpoint_seconds = 0;
  /// Training examples (images, sequences) per second over `seconds`,
  /// warm-up excluded; with a process group, of all ranks together.
  double examples_per_second = 0;
  /// A language model's training tokens per second: examples_per_second
  /// times the sequence length; 0 for classification.
  double tokens_per_second = 0;
  /// On CUDA the most memory allocated to tensors during the epoch's
  /// training, plus what CUDA graphs captured in an earlier epoch hold
  /// (TrainStep::cuda_graph_pool_bytes); on the CPU the process's peak RSS.
  int64_t peak_memory_bytes = 0;
  /// GradScaler's scale at the end of the epoch; 1 without loss scaling.
  double loss_scale = 1.0;
  int64_t skipped_steps = 0; ///< in this epoch
  double lr = 0;             ///< at the end of the epoch
  /// Whether the epoch was evaluated at its end: false where
  /// TrainerOptions::eval_every evaluates by steps instead (the test fields
  /// are then 0).
  bool evaluated = true;
  /// Whether the checkpoint was written at this epoch's end (or, partial(),
  /// at the step the run ended on): never without TrainerOptions::checkpoint
  /// or on ranks other than the main one (sharded: every rank writes).
  bool checkpoint_written = false;

  /// Whether the run ended inside this epoch (max_steps or
  /// TrainerOptions::steps): its loss, examples/s and learning rate are of the
  /// steps it ran, and its checkpoint holds the position inside it.
  bool partial() const { return resumed_steps + steps < steps_in_epoch; }
  /// Whether the test loss and accuracy are over the first test_batches of
  /// the test set only (TrainerOptions::limit_eval_batches).
  bool test_subset() const { return test_batches < test_batches_in_set; }
  /// exp(test_loss): a language model's test perplexity (perplexity()).
  double test_perplexity() const { return perplexity(test_loss); }
};

/// Progress inside an epoch, for progress bars and step logs.
struct BatchProgress {
  int64_t epoch = 0; ///< 1-based
  int64_t batch = 0; ///< 1-based
  /// The last `batch` of this epoch: `batches_in_epoch`, or fewer where
  /// max_steps stops the run inside this epoch (a progress bar's total).
  int64_t batches = 0;
  /// Batches of a whole epoch.
  int64_t batches_in_epoch = 0;
  int64_t examples = 0; ///< examples (images, sequences) in this batch
  int64_t global_step =
      0;         ///< batches trained so far, all epochs, this one included
  double lr = 0; ///< the learning rate of this step
  /// The gradients' global L2 norm before clipping (StepResult::grad_norm):
  /// a 0-dim tensor on the device, not read (see `loss`); undefined where
  /// clipping is off or the batch ended no accumulation cycle.
  torch::Tensor grad_norm;
  /// This batch's loss (FP32, unscaled) and the loss scale after its step,
  /// one-element tensors on the training device, not read: reading them
  /// waits for the device, so read them only when showing them (a redraw,
  /// every N steps), never every step.
  torch::Tensor loss;
  /// The loss scale after this batch's step (see `loss`); 1 without loss
  /// scaling.
  torch::Tensor loss_scale;
  /// The trainer's own running totals, live (updated in place by the
  /// following steps) and on the device: the sum of this epoch's finite
  /// losses so far (FP64), and the non-finite losses since fit() began
  /// (int64; `non_finite_before_epoch` of them before this epoch). A mean
  /// loss over any stretch of steps is a difference of two reads, so a
  /// display adds no work to the steps it does not draw.
  torch::Tensor epoch_loss_sum;
  /// Non-finite losses since fit() began, live on the device (int64; see
  /// `epoch_loss_sum`).
  torch::Tensor non_finite_losses;
  /// How many of `non_finite_losses` came before this epoch (a host value).
  int64_t non_finite_before_epoch = 0;
  /// Batches of this epoch trained before the run resumed inside it (0
  /// otherwise): this run's first batch of the epoch is resumed_batches + 1,
  /// and `epoch_loss_sum` starts from `resumed_loss_sum`.
  int64_t resumed_batches = 0;
  /// The epoch's sum of finite losses before the resume (see
  /// `resumed_batches`).
  double resumed_loss_sum = 0;
  /// Whether this batch is timed as warm-up (EpochStats::warmup_seconds).
  bool warmup = false;
};

/// Progress of an evaluation, for progress bars: one call per evaluation
/// batch this rank runs (with a process group rank r runs batches r,
/// r + ranks, ..., so its `batches` are its share).
struct EvalProgress {
  /// The epoch just trained (1-based); 0 for an evaluate() outside fit().
  int64_t epoch = 0;
  /// Whether the batches are the training data's (TrainerOptions::eval_train)
  /// rather than the test set's.
  bool training_data = false;
  int64_t batch = 0;   ///< 1-based, among this rank's
  int64_t batches = 0; ///< this rank's batches in this evaluation
  /// The batches this evaluation covers, all ranks together: the test
  /// set's, or the first TrainerOptions::limit_eval_batches of them.
  int64_t batches_evaluated = 0;
  int64_t batches_in_set = 0; ///< the test set's batches
  int64_t examples = 0;       ///< examples (images, sequences) in this batch
};

/// An evaluation of TrainerOptions::eval_every, at a step of the run.
struct StepEvaluation {
  int64_t global_step = 0; ///< the steps trained before it
  int64_t epoch = 0;       ///< 1-based: the epoch it fell in
  /// Mean training loss of the finite losses since the previous evaluation
  /// of this run (or its start); NaN before_training.
  double train_loss = 0;
  double test_loss = 0;     ///< mean cross-entropy per prediction evaluated
  double test_accuracy = 0; ///< in [0, 1], as EpochStats::test_accuracy
  int64_t test_batches = 0; ///< as EpochStats::test_batches
  int64_t test_batches_in_set = 0; ///< as EpochStats::test_batches_in_set
  int64_t test_examples = 0;       ///< as EpochStats::test_examples
  /// TrainerOptions::eval_train: the training data's evaluation (in eval
  /// mode, unlike `train_loss`); none without it.
  c10::optional<Evaluation> train_evaluation;
  double lr = 0;           ///< the learning rate of the last step
  double eval_seconds = 0; ///< the evaluation's time
  /// The lowest test loss of the run so far, this one included.
  double best_test_loss = 0;
  /// Whether this evaluation improved it and TrainerOptions::best_checkpoint
  /// was written.
  bool best_written = false;
  /// Whether TrainerOptions::checkpoint was written at this step.
  bool checkpoint_written = false;
  /// TrainerOptions::eval_at_start's evaluation, before the run's first
  /// step: no training loss, no checkpoint, not a best.
  bool before_training = false;
  /// exp(test_loss) (perplexity()).
  double test_perplexity() const { return perplexity(test_loss); }
};

namespace detail {
class DivergenceWatch;
class StopCadence;
} // namespace detail

/// Trains a model with cross-entropy on a DeviceLoader, for its
/// TrainerOptions::task: a classifier (a class per example) or a language
/// model (token ids [N, T] with the next token of each position as targets,
/// data::read_text_windows(); the model returns [N, T, vocab], every
/// position is a prediction, and the test loss, perplexity and next-token
/// accuracy are per token):
///  1. each step sets the scheduled learning rate, takes a batch on the
///     device and runs a lamp::TrainStep in the chosen precision;
///  2. after each epoch it evaluates on the test set (under the same
///     precision; the first limit_eval_batches batches where that is set),
///     reports EpochStats and writes the checkpoint (an epoch cut short by
///     max_steps is reported partial(), its checkpoint holding the position
///     inside it, where a longer run resumes);
///  3. resuming loads model, master weights, optimizer, scaler and the
///     position, and continues exactly: the data order and augmentation of an
///     epoch depend only on (seed, epoch).
///
/// Errors: a loss that stays non-finite or steps that keep overflowing for
/// `divergence_patience` steps (across epochs), or an epoch that ends with a
/// non-finite mean loss or non-finite weights, stop training with an error
/// naming the epoch and what to change, and the first module whose output
/// or gradient held inf/NaN (TrainerOptions::check_numerics); the last
/// checkpoint is left untouched, and a checkpoint with non-finite weights is
/// never written. So does a loss scale stuck at its minimum
/// (GradScalerOptions::min_scale_patience), checked at the same points.
///
/// Resuming checks the checkpoint's checksum and that this run repeats its
/// model, dataset size, precision, optimizer, batch size, epochs (more are
/// allowed with a constant schedule: the run continues), learning
/// rate, schedule, momentum, weight decay, no-bias-decay, accumulation steps
/// and seed, and (where the checkpoint stores them: older ones did not)
/// max_grad_norm, nesterov, skip_non_finite, force_loss_scaling, tf32, the
/// loader's shuffle, crop_padding, horizontal_flip, mean, std, dtype and
/// num_shards, and the training and test data themselves
/// (data::fingerprint()); an error names the differing setting, through
/// TrainerOptions::option_name. Then it checks every tensor's shape and
/// dtype (TrainStep::load), before anything changes. A checkpoint of a
/// finished run resumes with start_epoch() == epochs: fit() then trains
/// nothing. TrainerOptions::init_from starts a new run from a checkpoint's
/// weights instead (load_weights_from_checkpoint()), after the step has
/// converted the model, so that the master weights get the FP32 values.
///
/// Thread safety: one thread at a time per trainer (its TrainStep refuses a
/// step from a second thread while one runs); different trainers on
/// different threads are fine.
class Trainer {
 public:
  /// The model's forward pass: inputs (images [N, C, H, W], token ids
  /// [N, T]) -> [N, classes] logits or log-probabilities
  /// (models::NamedModel::forward); [N, T, vocab] for a language model.
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

  /// `model` must already be on `train_loader`'s device; `forward` runs it
  /// (logits or log-probabilities). `model_name` is stored in checkpoints and
  /// checked on resume. Throws c10::Error when a loader's data does not fit
  /// options.task() (Task::check()).
  Trainer(std::shared_ptr<torch::nn::Module> model, Forward forward,
          std::string model_name, data::DeviceLoader train_loader,
          data::DeviceLoader test_loader, TrainerOptions options);

  /// Runs the remaining epochs; `on_epoch` gets each epoch's stats,
  /// `on_batch` (optional) each training batch's progress, `on_eval_batch`
  /// (optional) each evaluation batch's.
  std::vector<EpochStats> fit(
      const std::function<void(const EpochStats&)>& on_epoch = nullptr,
      const std::function<void(const BatchProgress&)>& on_batch = nullptr,
      const std::function<void(const EvalProgress&)>& on_eval_batch = nullptr,
      const std::function<void(const StepEvaluation&)>& on_evaluation =
          nullptr);

  /// Test loss and accuracy of the current model, over the batches
  /// TrainerOptions::limit_eval_batches allows (all by default).
  std::pair<double, double> evaluate();
  /// The same evaluation, with how much of the test set it covered;
  /// `on_batch` (optional) gets each of this rank's batches.
  Evaluation evaluate_subset(
      const std::function<void(const EvalProgress&)>& on_batch = nullptr,
      int64_t epoch = 0);

  /// evaluate_subset() (with `training_data`, evaluate_training_data())
  /// that stops where TrainerOptions::stop_requested asks, as fit()'s
  /// evaluations do: false then, with `result` untouched and stop_point()
  /// saying which rank asked (StopPoint::in_evaluation; its steps 0). In a
  /// data-parallel run every rank stops at one turn of the batches: one
  /// all-reduce a turn (every 32nd on CUDA), each rank taking as many turns
  /// as the one with the most batches. True, with `result`, otherwise.
  bool evaluate_unless_stopped(
      Evaluation& result, bool training_data = false,
      const std::function<void(const EvalProgress&)>& on_batch = nullptr,
      int64_t epoch = 0);

  /// The training data's evaluation of TrainerOptions::eval_train (which
  /// this call needs not be set for): in eval mode, without augmentation,
  /// over the batches it describes; `on_batch` as in evaluate_subset().
  Evaluation evaluate_training_data(
      const std::function<void(const EvalProgress&)>& on_batch = nullptr,
      int64_t epoch = 0);

  /// The first epoch fit() will run (0-based; > 0 after resuming).
  int64_t start_epoch() const { return start_epoch_; }
  /// The steps of start_epoch() already trained: > 0 after resuming a
  /// checkpoint written inside an epoch.
  int64_t start_step_in_epoch() const { return start_step_in_epoch_; }
  /// Steps trained so far, all epochs.
  int64_t global_step() const { return global_step_; }
  /// The run's length in steps: TrainerOptions::steps, or epochs times the
  /// batches per epoch.
  int64_t total_steps() const { return total_steps_; }
  /// Whether the run has trained all its steps (a resumed finished run:
  /// fit() trains nothing).
  bool finished() const { return global_step_ >= total_steps_; }
  /// The run's history: what the resumed checkpoint recorded, with an entry
  /// added when this run continues it with more epochs or starts from
  /// another run's weights; written into every checkpoint.
  const std::vector<RunHistoryEntry>& history() const { return history_; }
  /// The TrainStep that runs each step: its optimizer, scaler and master
  /// weights.
  TrainStep& train_step() { return *step_; }
  /// The options the trainer was made with.
  const TrainerOptions& options() const { return options_; }
  /// Where fit() stopped on TrainerOptions::stop_requested; stopped is false
  /// when it ran to the end.
  const StopPoint& stop_point() const { return stop_point_; }

  /// Writes a checkpoint (model, master weights, optimizer, scaler, epoch,
  /// step, the global CPU generator's state, the run's settings) to `path`
  /// with save_checked_archive(): atomically, durably, checksummed. Refuses
  /// a model with inf/NaN weights. With sharded optimizer state
  /// (TrainerOptions::zero_stage) a collective: every rank writes its shard
  /// and rank 0 the manifest at `path`.
  void save_checkpoint(const std::string& path) const;
  /// Loads one written by save_checkpoint() for the same model and settings;
  /// all or nothing (see the class comment).
  void load_checkpoint(const std::string& path);

 private:
  std::shared_ptr<torch::nn::Module> model_;
  Forward forward_;
  std::string model_name_;
  data::DeviceLoader train_loader_;
  data::DeviceLoader test_loader_;
  TrainerOptions options_;
  std::unique_ptr<TrainStep> step_;
  // TrainerOptions::check_numerics: the check of every step, and the latest
  // finding that did not stop (an overflow under loss scaling).
  std::unique_ptr<NumericsCheck> numerics_;
  c10::optional<NumericsFinding> last_finding_;
  // The latest training batch, re-run under the check to name the first
  // module when training diverges.
  torch::Tensor last_inputs_;
  torch::Tensor last_targets_;
  std::unique_ptr<CheckpointLock> lock_; // on options_.checkpoint()
  // Sharded checkpoints (TrainerOptions::zero_stage): this rank's shard
  // file of the checkpoint at options_.checkpoint(), removed once the next
  // manifest no longer names it; "" on rank 0 and before the first.
  mutable std::vector<std::string> previous_shards_;
  // Whether this trainer has written options_.checkpoint() yet: its first
  // write removes the shard files earlier runs left under that name.
  mutable bool checkpoint_written_before_ = false;
  int64_t warmup_steps_left_ = 1; // steps of the run still timed as warm-up
  int64_t start_epoch_ = 0;
  int64_t start_step_in_epoch_ = 0;
  int64_t global_step_ = 0;
  int64_t total_steps_ = 0;
  // Resumed inside an epoch: what that epoch had summed before the
  // checkpoint (its finite losses, FP64, and its non-finite ones).
  double resumed_loss_sum_ = 0;
  int64_t resumed_non_finite_ = 0;
  // The lowest test loss of TrainerOptions::eval_every's evaluations (inf
  // before the first), stored in checkpoints.
  double best_test_loss_ = std::numeric_limits<double>::infinity();
  // The test examples best_test_loss_ was measured on (0: unknown): a
  // resume may evaluate another subset (limit_eval_batches).
  int64_t best_test_examples_ = 0;
  // The global step TrainerOptions::checkpoint holds (-1: none yet).
  int64_t checkpoint_step_ = -1;
  // TrainerOptions::eval_every: the finite losses (FP64, on the device) and
  // steps since the last evaluation, and the watch's non-finite count then.
  torch::Tensor interval_loss_sum_;
  int64_t interval_steps_ = 0;
  int64_t interval_non_finite_before_ = 0;
  // The interval a checkpoint carried (or the last fit() left): the next
  // evaluation covers its steps too, as the straight run's does.
  double resumed_interval_loss_sum_ = 0;
  int64_t resumed_interval_steps_ = 0;
  int64_t resumed_interval_non_finite_ = 0;
  // A stop came inside the evaluation (eval_every) at the checkpoint's
  // step: fit() runs that evaluation first.
  bool evaluation_pending_ = false;
  // Every rank's sums ([ranks, 4], FP64, on the CPU: the epoch's finite
  // losses and non-finite count, the interval's), gathered by every rank
  // for the checkpoint of step rank_sums_step_.
  torch::Tensor rank_sums_;
  int64_t rank_sums_step_ = -1;
  // The time of the checkpoints written since the epoch's start.
  double checkpoint_seconds_ = 0;
  // The latest step's loss (a device tensor, read only where a checkpoint
  // is about to be written).
  torch::Tensor last_loss_;
  std::vector<RunHistoryEntry> history_;
  StopPoint stop_point_;
  // data::fingerprint() of the training and test data, stored in
  // checkpoints and checked on resume.
  std::string train_data_;
  std::string test_data_;

  // ProcessGroup::check_same() of the run's settings and data, before the
  // first broadcast.
  void check_ranks_agree(distributed::ProcessGroup& group) const;
  struct EpochRun;
  // The epoch fit() is training, for save_checkpoint(); nullptr outside.
  const EpochRun* active_run_ = nullptr;
  // The checkpoint at TrainerOptions::best_checkpoint, locked as the other.
  std::unique_ptr<CheckpointLock> best_lock_;
  // The constructor's checks of steps, the schedule's shape, eval_every,
  // checkpoint_every and best_checkpoint.
  void check_step_options(int64_t batches) const;
  bool single_process() const;
  // fit()'s work; fit() leaves its error's word for the other ranks.
  std::vector<EpochStats> fit_epochs(
      const std::function<void(const EpochStats&)>& on_epoch,
      const std::function<void(const BatchProgress&)>& on_batch,
      const std::function<void(const EvalProgress&)>& on_eval_batch,
      const std::function<void(const StepEvaluation&)>& on_evaluation);
  // Whether this rank writes (its part of) TrainerOptions::checkpoint.
  bool checkpoint_is_mine() const;
  // `write` on rank 0 of a data-parallel run whose checkpoint is whole, the
  // other ranks agreeing on it (one refusal, a full disk, stops every rank
  // at once, naming it); alone or sharded, `write` on this rank.
  void write_on_main_rank(const std::string& what,
                          const std::function<void()>& write);
  // Writes TrainerOptions::checkpoint at this step and records it: every
  // rank calls it at the same steps.
  void write_checkpoint();
  // write_checkpoint(), unless the latest step's loss was inf/NaN (on any
  // rank, where the ranks write it together): a model whose loss is no
  // longer finite does not replace the checkpoint inside an epoch, where
  // no evaluation or epoch check has looked at it; a warning says so.
  void write_checkpoint_if_finite();
  // Where fit() leaves `run` inside its epoch: its sums, which a
  // save_checkpoint() after fit() stores with the position.
  void keep_epoch_sums(const EpochRun& run);
  // Where fit() leaves the interval since the last evaluation.
  void keep_interval_sums(const detail::DivergenceWatch& watch);
  // This rank's sums at the current position, as a checkpoint stores them:
  // {epoch loss sum, epoch non-finite, interval loss sum, interval
  // non-finite} (a host read of device sums inside fit()).
  std::array<double, 4> local_sums() const;
  // rank_sums_ at this step: a collective every rank calls before a
  // checkpoint's write (a no-op in one process).
  void gather_rank_sums();
  // The evaluation a stop interrupted (evaluation_pending_), before the
  // first step of `run`; false where it is stopped again.
  bool pending_evaluation(
      EpochRun& run, detail::DivergenceWatch& watch,
      const std::function<void(const EvalProgress&)>& on_eval_batch,
      const std::function<void(const StepEvaluation&)>& on_evaluation);
  // After a stop: the checkpoint at the step it stopped on, where nothing
  // of the run would otherwise be lost and this process may write it.
  void save_at_stop();
  // train_epoch(), evaluate_at_step() and evaluate_epoch() return false
  // where stop_here() stopped them.
  bool train_epoch(
      EpochRun& run, detail::DivergenceWatch& watch,
      const std::function<void(const BatchProgress&)>& on_batch,
      const std::function<void(const EvalProgress&)>& on_eval_batch,
      const std::function<void(const StepEvaluation&)>& on_evaluation);
  // The schedule's rate for the next step (global_step_ + 1), and for the
  // step of 0-based index `step`.
  double next_learning_rate() const;
  double learning_rate_at(int64_t step) const;
  // `before_training`: TrainerOptions::eval_at_start's evaluation.
  bool evaluate_at_step(
      EpochRun& run, detail::DivergenceWatch& watch,
      const std::function<void(const EvalProgress&)>& on_eval_batch,
      const std::function<void(const StepEvaluation&)>& on_evaluation,
      bool before_training = false);
  void finish_epoch(EpochRun& run, detail::DivergenceWatch& watch);
  bool evaluate_epoch(
      EpochRun& run, detail::DivergenceWatch& watch,
      const std::function<void(const EvalProgress&)>& on_eval_batch);
  // evaluate_subset(); inside fit() it stops, returning none, where `stop`
  // (stop_here()) says so before a batch.
  // `training_data`: the loader of TrainerOptions::eval_train instead of
  // the test set's.
  c10::optional<Evaluation> run_evaluation(
      const std::function<void(const EvalProgress&)>& on_batch, int64_t epoch,
      const std::function<bool()>& stop, bool training_data = false);
  // run_evaluation() of the test set and, with TrainerOptions::eval_train,
  // the training data; none where `stop` stopped either.
  c10::optional<std::pair<Evaluation, c10::optional<Evaluation>>>
  run_evaluations(const std::function<void(const EvalProgress&)>& on_batch,
                  int64_t epoch, const std::function<bool()>& stop);
  // The loader TrainerOptions::eval_train evaluates, made on first use.
  const data::DeviceLoader& train_eval_loader();
  std::unique_ptr<data::DeviceLoader> train_eval_loader_;
  void end_epoch(EpochRun& run);
  // TrainerOptions::stop_requested's answer; on true, stop_point_ records
  // where (`run`'s epoch, after `steps` of its steps).
  bool stop_here(const EpochRun& run, int64_t steps, bool in_evaluation);
  // The rank whose stop_requested asks now, before a step's cycle or at
  // an evaluation's turn (in a data-parallel run agreed over the ranks at
  // the checks stop_cadence_ makes due), or -1.
  int rank_asking_to_stop(bool in_evaluation);
  // The rank asked to stop, over the ranks of a data-parallel run (-1:
  // none), from this rank's `asked`, and the cycles until the next check
  // agreed from each rank's `proposal`: one all-reduce.
  int rank_asked_to_stop(bool asked, int64_t proposal, bool in_evaluation);
  // Starts the stop checks anew (fit(), evaluate_unless_stopped()).
  void restart_stop_checks();
  // When the ranks next check (every cycle of a CPU group's training).
  std::shared_ptr<detail::StopCadence> stop_cadence_;
  // Whether stop_cadence_ counts an evaluation's turns, not steps.
  bool stop_cadence_in_evaluation_ = false;
  // Whether stop_requested said true since the last check: asked at every
  // cycle, answered at the next check.
  bool stop_asked_ = false;
  // rank_asked_to_stop()'s all-reduced answer, on the group's device.
  torch::Tensor stop_answer_;
  // The divergence messages' pointer to the first module with inf/NaN (""
  // when none is found).
  std::string locate_numerics();
  // Whether the step's backward runs on a dynamically scaled loss.
  bool loss_scaled();
};

/// lamp 0.4's name of Trainer (which then trained classifiers, and language
/// models as classifiers of positions).
using ClassifierTrainer [[deprecated(
    "lamp 0.5 renamed ClassifierTrainer to lamp::training::Trainer")]] =
    Trainer;

} // namespace training
} // namespace lamp
