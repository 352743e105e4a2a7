#pragma once

/// \file
/// Learning-rate schedules for the training loop.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

#include "lamp/platform/names.h"

namespace lamp {
namespace training {

/// How the learning rate moves over a run, from the peak learning rate
/// (TrainerOptions::lr) and the run's total steps; see learning_rate().
enum class Schedule {
  kConstant,     ///< "constant": the peak learning rate throughout.
  kCosine,       ///< "cosine": cosine decay from the peak to 0.
  kOneCycle,     ///< "onecycle": PyTorch's OneCycleLR defaults: from peak/25 up
                 ///< to the peak over the first 30% (cosine), then down to
                 ///< peak/(25*1e4) (cosine).
  kWarmupCosine, ///< "warmup-cosine": GPT trainers' (nanoGPT's) linear
                 ///< warm-up over a number of steps, then cosine decay to a
                 ///< floor at the run's end (warmup_cosine_lr()).
};

/// The spellings of the schedules, in the order the programs list them:
/// "onecycle", "cosine", "warmup-cosine", "constant".
const NameTable<Schedule>& schedule_table();
/// Parses "constant", "cosine", "warmup-cosine", "onecycle"; anything else
/// is an error that lists them.
Schedule parse_schedule(const std::string& name);
/// The name parse_schedule() reads back: "constant", "cosine",
/// "warmup-cosine" or "onecycle".
std::string to_string(Schedule schedule);

/// Whether the schedule's learning rates depend on the run's total steps:
/// true for cosine, warmup-cosine and onecycle, whose curves stretch with
/// the run, false for constant. A finished run of a schedule that depends on its length cannot
/// be continued with more epochs: the longer run's curve is another one, so
/// the learning rate would jump where the first run stopped
/// (Trainer; start a new run from the weights with
/// TrainerOptions::init_from instead).
bool depends_on_length(Schedule schedule);

/// The learning rate at `step` (0-based) of `total_steps` for a peak of
/// `peak_lr`. `warmup_steps` and `min_lr` are kWarmupCosine's
/// (warmup_cosine_lr()); the other schedules ignore them.
double learning_rate(Schedule schedule, double peak_lr, int64_t step,
                     int64_t total_steps, int64_t warmup_steps = 0,
                     double min_lr = 0.0);

/// The warm-up + cosine curve of GPT trainers, by step: linear warm-up to
/// `peak_lr` over `warmup_steps` (peak_lr * (step + 1) / warmup_steps, the
/// peak at step warmup_steps - 1), then cosine decay from `peak_lr` at step
/// `warmup_steps` towards `min_lr`, which it reaches at `total_steps` and
/// keeps after. Errors name a negative step or warm-up, a warm-up not
/// shorter than the run, and a `min_lr` outside [0, peak_lr].
///
/// Example (nanoGPT's shape: 2% warm-up, a floor of a tenth of the peak):
/// \code
///   for (int64_t step = 0; step < total; ++step) {
///     lamp::training::set_learning_rate(
///         train.optimizer(), lamp::training::warmup_cosine_lr(
///                                6e-4, step, total / 50, total, 6e-5));
///     train.step(x, y, loss_fn);
///   }
/// \endcode
double warmup_cosine_lr(double peak_lr, int64_t step, int64_t warmup_steps,
                        int64_t total_steps, double min_lr = 0.0);

/// Sets the learning rate of every parameter group of `optimizer`.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

} // namespace training
} // namespace lamp
