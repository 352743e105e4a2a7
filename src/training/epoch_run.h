#pragma once

// Trainer's epoch in progress, shared by the training loop
// (trainer.cpp) and the checkpoint it writes inside an epoch
// (trainer_checkpoint.cpp).

#include <torch/types.h>

#include <chrono>
#include <cstdint>

#include "lamp/training/trainer.h"
#include "training/divergence_watch.h"

namespace lamp {
namespace training {

// One epoch in progress: its stats and the running sums behind them.
struct Trainer::EpochRun {
  int64_t epoch = 0;       // 0-based
  int64_t batches = 0;     // of a whole epoch
  int64_t first_batch = 0; // 0-based: > 0 where a resume starts inside it
  int64_t last_batch = 0;  // 1-based: `batches`, or fewer where the run ends
  int64_t end_step = 0;    // the global step the run ends on
  // TrainerOptions::eval_at_start: evaluate before the epoch's first step
  // (the run's first epoch only).
  bool evaluate_first = false;
  // The evaluation a stop interrupted at the resumed step: run before the
  // epoch's first step, as the evaluation it was (not eval_at_start's).
  bool evaluate_pending = false;
  EpochStats stats;
  // FP64, on the device: the epoch's finite losses (those before a resume
  // inside it too).
  torch::Tensor loss_sum;
  int64_t non_finite_before = 0;
  int64_t non_finite_resumed = 0; // the epoch's before a resume inside it
  const detail::DivergenceWatch* watch = nullptr;

  // The epoch's non-finite losses so far, those before a resume inside it
  // included (a host read of the watch's counter).
  int64_t non_finite() const {
    return watch->read_non_finite_losses() - non_finite_before +
           non_finite_resumed;
  }
  int64_t examples = 0;
  int64_t warmup_examples = 0;
  bool graphs_before_epoch = false;
  std::chrono::steady_clock::time_point start;
};

} // namespace training
} // namespace lamp
