#pragma once

// What train_cifar10 and train_mnist show while they train: the progress bar,
// the progress lines and the line per epoch.

#include <lamp/lamp.h>

#include "json_log.h"
#include "options.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lamp_examples {

/// The mean of the finite losses and the examples of a stretch of steps inside
/// one epoch, as differences of the trainer's running totals
/// (BatchProgress::epoch_loss_sum, non_finite_losses): nothing is added to
/// the steps; take() reads the device once.
class LossWindow {
 public:
  void add(const lamp::training::BatchProgress& p);
  /// {mean finite loss (NaN when none was finite), examples} since the last
  /// take() in this epoch; the examples leave out the epoch's first batch,
  /// which ends before the rate's clock starts.
  std::pair<double, int64_t> take(const lamp::training::BatchProgress& p);

 private:
  double sum_at_ = 0;
  int64_t non_finite_at_ = 0;
  int64_t batch_at_ = 0;
  int64_t examples_ = 0;
};

/// An evaluation's figures as the epoch lines give them: "test loss 0.3456
/// test acc 87.65%", for a language model "val loss 1.7138 (ppl 5.55)  val
/// acc 47.12%", then " (first 2 of 10 batches)" where `batches` of the
/// `in_set` were evaluated; "train loss ..." of the training data's
/// (`training_data`, --eval-train).
std::string evaluation_text(double loss, double accuracy, int64_t batches,
                            int64_t in_set, bool language_model,
                            bool training_data = false);

/// The training loss's " (eval mode 1.2345)" of an epoch or step line where
/// --eval-train evaluated the training data; "" without it.
std::string eval_mode_text(
    const c10::optional<lamp::training::Evaluation>& train);

/// Progress inside an epoch, as people expect from tqdm:
///  - on a terminal, a bar on stderr fitted to its width, redrawn at most ten
///    times a second: batches (up to where --max-steps stops the run),
///    running loss, img/s, loss scale, ETA; then a bar of its own while the
///    test set is evaluated;
///  - every `log_every` steps (or, on a non-terminal without --log-every,
///    every 30 s) a plain line on stdout, and with --log-json a "step"
///    record; during evaluation a line every `log_every` evaluation batches
///    (or every 30 s), without a record;
///  - after each epoch, its line on stdout, saying where the epoch was cut
///    short and where the test accuracy is over a subset of the test set;
///  - clear() erases the bar before any other output (epoch lines, errors).
class Progress {
 public:
  /// `tokens_per_example` > 0: the run trains on sequences of that many
  /// tokens, and rates are tokens/s, the epoch line's losses with their
  /// perplexities.
  /// `mfu_per_example`: the model's FLOPs per example over the device's
  /// peak FLOP/s; the epoch line shows MFU where it is above 0.
  Progress(bool bar, bool timed_lines, int64_t log_every, bool show_scale,
           int64_t epochs, JsonLog* log, int64_t tokens_per_example = 0,
           double mfu_per_example = 0);

  /// The display the program's flags ask for: the bar on stderr when it is a
  /// terminal; plain lines on stdout every --log-every steps, or every 30 s
  /// when stdout is not a terminal (a CI log, `| tee`); nothing on ranks
  /// other than the main one. `show_scale`: the run scales its loss.
  static Progress for_program(const ProgramConfig& config, bool main_rank,
                              bool show_scale, JsonLog* log);

  /// An error unwinding through the run erases the bar before it is printed.
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool active() const { return bar_ || timed_lines_ || log_every_ > 0; }

  /// The trainer's per-batch callback: update(), or nullptr when inactive
  /// (the trainer then reads nothing per batch).
  std::function<void(const lamp::training::BatchProgress&)> on_batch();
  /// The trainer's per-evaluation-batch callback: update_eval(), or nullptr
  /// when inactive.
  std::function<void(const lamp::training::EvalProgress&)> on_eval_batch();

  void update(const lamp::training::BatchProgress& p);
  void update_eval(const lamp::training::EvalProgress& p);

  /// Erases the bar and prints the epoch's line on stdout.
  void print_epoch(const lamp::training::EpochStats& s);
  /// Erases the bar and prints a line for an evaluation of --eval-every:
  /// the step (of `total_steps`), the training loss since the previous one,
  /// the test (val) loss, perplexity and accuracy, the learning rate, and
  /// whether the best and the last checkpoints were written.
  void print_evaluation(const lamp::training::StepEvaluation& e,
                        int64_t total_steps);

  void clear();

 private:
  std::string scale_text(const lamp::training::BatchProgress& p) const;
  void write_line(const lamp::training::BatchProgress& p,
                  std::chrono::steady_clock::time_point now);
  void draw(const lamp::training::BatchProgress& p,
            std::chrono::steady_clock::time_point now);
  void draw_eval(const lamp::training::EvalProgress& p,
                 std::chrono::steady_clock::time_point now);
  // One bar on stderr, over the previous one: `left`, the bar at `done` of
  // `total`, then `parts`, fitted to the terminal's width.
  void draw_bar(const std::string& left, const std::vector<std::string>& parts,
                int64_t done, int64_t total);

  const bool bar_;
  const bool timed_lines_;
  const int64_t log_every_;
  const bool show_scale_;
  const int64_t epochs_;
  JsonLog* log_;
  const int64_t tokens_per_example_;
  // Model FLOPs per example over the device's peak FLOP/s: MFU is the
  // examples per second times this (0: not reported).
  const double mfu_per_example_;
  // Examples per second -> the rate shown: images/s (img/s), or tokens/s.
  double shown_rate(double examples_per_second) const;
  const char* rate_unit() const;
  LossWindow bar_window_, line_window_;
  std::chrono::steady_clock::time_point epoch_start_, line_start_, last_line_,
      last_draw_, eval_start_;
  int64_t epoch_examples_ = 0;
  bool drawn_ = false;
};

} // namespace lamp_examples
