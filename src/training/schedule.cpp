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
  static const NameTable<Schedule> table("learning-rate schedule", "schedules",
                                         {{"onecycle", Schedule::kOneCycle},
                                          {"cosine", Schedule::kCosine},
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
                     int64_t total_steps) {
  TORCH_CHECK(
      total_steps > 0 && step >= 0,
      "lamp::training::learning_rate: need step >= 0 and total_steps > 0, got ",
      step, " and ", total_steps, ".");
  step = std::min(step, total_steps - 1);
  switch (schedule) {
    case Schedule::kConstant:
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

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

} // namespace training
} // namespace lamp
