#include "lamp/training/schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace lamp {
namespace training {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Cosine interpolation from `from` (t = 0) to `to` (t = 1).
double cosine(double from, double to, double t) {
  return to + (from - to) * 0.5 * (1.0 + std::cos(kPi * t));
}

} // namespace

const NameTable<Schedule>& schedule_table() {
  static const NameTable<Schedule> table(
      "learning-rate schedule", "schedules",
      {{"onecycle", Schedule::kOneCycle},
       {"cosine", Schedule::kCosine},
       {"warmup-cosine", Schedule::kWarmupCosine},
       {"constant", Schedule::kConstant}});
  return table;
}

Schedule parse_schedule(const std::string& name) {
  return schedule_table().parse(name);
}

std::string to_string(Schedule schedule) {
  return schedule_table().name(schedule);
}

bool depends_on_length(Schedule schedule) {
  return schedule != Schedule::kConstant;
}

double learning_rate(Schedule schedule, double peak_lr, int64_t step,
                     int64_t total_steps, int64_t warmup_steps, double min_lr) {
  TORCH_CHECK(
      total_steps > 0 && step >= 0,
      "lamp::training::learning_rate: need step >= 0 and total_steps > 0, got ",
      step, " and ", total_steps, ".");
  if (schedule == Schedule::kWarmupCosine) {
    return warmup_cosine_lr(peak_lr, step, warmup_steps, total_steps, min_lr);
  }
  step = std::min(step, total_steps - 1);
  switch (schedule) {
    case Schedule::kConstant:
    case Schedule::kWarmupCosine: // above
      return peak_lr;
    case Schedule::kCosine:
      return cosine(peak_lr, 0.0, static_cast<double>(step) / total_steps);
    case Schedule::kOneCycle: {
      // torch.optim.lr_scheduler.OneCycleLR(pct_start=0.3, div_factor=25,
      // final_div_factor=1e4, anneal_strategy="cos").
      const double initial = peak_lr / 25.0;
      const double final_lr = initial / 1e4;
      const double warmup_end = 0.3 * total_steps - 1;
      if (step <= warmup_end) {
        return cosine(initial, peak_lr,
                      warmup_end > 0 ? step / warmup_end : 1.0);
      }
      const double rest = (total_steps - 1) - warmup_end;
      return cosine(peak_lr, final_lr,
                    rest > 0 ? (step - warmup_end) / rest : 1.0);
    }
  }
  return peak_lr;
}

double warmup_cosine_lr(double peak_lr, int64_t step, int64_t warmup_steps,
                        int64_t total_steps, double min_lr) {
  TORCH_CHECK(step >= 0 && warmup_steps >= 0 && total_steps > warmup_steps,
              "lamp::training::warmup_cosine_lr: need step >= 0 and 0 <= "
              "warmup_steps < total_steps, got step ",
              step, ", warmup_steps ", warmup_steps, ", total_steps ",
              total_steps, ".");
  TORCH_CHECK(min_lr >= 0 && min_lr <= peak_lr,
              "lamp::training::warmup_cosine_lr: min_lr must be in [0, "
              "peak_lr = ",
              peak_lr, "], got ", min_lr, ".");
  if (step < warmup_steps) {
    return peak_lr * static_cast<double>(step + 1) / warmup_steps;
  }
  if (step >= total_steps) {
    return min_lr;
  }
  return cosine(
      peak_lr, min_lr,
      static_cast<double>(step - warmup_steps) / (total_steps - warmup_steps));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

} // namespace training
} // namespace lamp
