#pragma once

/// \file
/// Learning-rate schedules for the training loop.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

namespace lamp {
namespace training {

enum class Schedule {
  kConstant, ///< "constant": the peak learning rate throughout.
  kCosine,   ///< "cosine": cosine decay from the peak to 0.
  kOneCycle, ///< "onecycle": PyTorch's OneCycleLR defaults: from peak/25 up
             ///< to the peak over the first 30% (cosine), then down to
             ///< peak/(25*1e4) (cosine).
};

/// Parses "constant", "cosine", "onecycle"; anything else is an error that
/// lists them.
Schedule parse_schedule(const std::string& name);
std::string to_string(Schedule schedule);

/// The learning rate at `step` (0-based) of `total_steps` for a peak of
/// `peak_lr`.
double learning_rate(Schedule schedule, double peak_lr, int64_t step,
                     int64_t total_steps);

/// Sets the learning rate of every parameter group of `optimizer`.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

} // namespace training
} // namespace lamp
