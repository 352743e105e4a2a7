#include "auto_precision.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

namespace lamp_examples {
namespace {

// Timed steps of a candidate, after one untimed: as many as fit in
// kEnough seconds (a few milliseconds' step timed once would be mostly
// noise: runs of 3 steps chose differently from one run to the next), at
// least one and at most kMostSteps.
constexpr int kMostSteps = 50;
constexpr double kEnough = 0.5;

// The first batch of `data` as a model takes it: images as floats in
// [0, 1] (the values do not change a step's time), tokens as int64.
std::pair<torch::Tensor, torch::Tensor> first_batch(
    const ProgramConfig& config, const lamp::data::Dataset& data,
    torch::Device device) {
  const int64_t n = std::min<int64_t>(config.batch_size, data.size());
  auto inputs = data.inputs.narrow(0, 0, n);
  auto targets = data.targets.narrow(0, 0, n).to(device, torch::kLong);
  if (data.sequences()) {
    return {inputs.to(device, torch::kLong), targets};
  }
  inputs = inputs.to(device, torch::kFloat).div(255);
  if (config.channels_last) {
    inputs = inputs.contiguous(torch::MemoryFormat::ChannelsLast);
  }
  return {inputs, targets};
}

// Seconds a training step of a fresh model takes in `precision`.
double seconds_per_step(
    const ProgramConfig& config, const lamp::data::Dataset& data,
    const lamp::training::Task& task, torch::Device device,
    const std::function<BuiltModel(lamp::Precision)>& make_model,
    lamp::Precision precision) {
  auto model = make_model(precision);
  lamp::TrainStep step(
      model.module,
      [&config](std::vector<torch::Tensor> params) {
        return lamp::optim::make_optimizer(
            std::move(params),
            lamp::optim::OptimizerOptions().name(config.optimizer));
      },
      lamp::TrainStepOptions(precision));
  const auto batch = first_batch(config, data, device);
  const auto loss = [&](const torch::Tensor& x, const torch::Tensor& y) {
    return task.loss(model.forward(x), y);
  };
  step.step(batch.first, batch.second, loss); // warm-up: first-use costs
  int steps = 0;
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  while (steps == 0 || (steps < kMostSteps && seconds < kEnough)) {
    step.step(batch.first, batch.second, loss).loss.item<float>();
    ++steps;
    seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  }
  return seconds / steps;
}

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f ms", seconds * 1e3);
  return text;
}

} // namespace

AutoPrecision resolve_auto_precision(
    const ProgramConfig& config, const lamp::data::Dataset& data,
    const lamp::training::Task& task, lamp::distributed::ProcessGroup& group,
    const std::function<BuiltModel(lamp::Precision)>& make_model,
    const std::string& stored) {
  using lamp::Precision;
  if (!stored.empty()) {
    const auto precision = lamp::parse_precision(stored);
    // --eval-only has moved --resume's path to --init-from's.
    const auto& from = config.resume.empty() ? config.init_from : config.resume;
    return {precision, "auto: " + stored + " (the mode " + from +
                           " was trained in, chosen when its run began)"};
  }
  const auto device = group.device();
  const auto support = lamp::precision_support(device);
  if (!device.is_cpu() || support.automatic != Precision::kAMPBF16) {
    return {support.automatic, "auto: " + lamp::to_string(support.automatic) +
                                   " (" + support.automatic_reason + ")"};
  }
  // Native BF16 on a CPU: faster or slower than fp32 by model and CPU.
  const std::vector<Precision> candidates = {Precision::kFP32,
                                             Precision::kAMPBF16};
  std::vector<double> seconds(candidates.size(), 0.0);
  auto choice = torch::zeros({1}, torch::kLong);
  if (group.is_main()) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      seconds[i] = seconds_per_step(config, data, task, device, make_model,
                                    candidates[i]);
    }
    choice[0] = seconds[1] < seconds[0] ? 1 : 0;
  }
  // Every rank trains in the main rank's choice (gathered on the group's
  // device: NCCL's collectives take no CPU tensor).
  choice = choice.to(group.device());
  group.all_reduce_(choice, lamp::distributed::ReduceOp::kSum,
                    "the agreement on --precision auto's choice");
  choice = choice.cpu();
  const auto chosen =
      candidates.at(static_cast<size_t>(choice.item<int64_t>()));
  std::string line = "auto: " + lamp::to_string(chosen);
  if (group.is_main()) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%.2fx", seconds[0] / seconds[1]);
    line +=
        " (BF16 is native on this CPU, and timing a training step of "
        "this model on its first batch gave fp32 " +
        milliseconds(seconds[0]) + ", amp-bf16 " + milliseconds(seconds[1]) +
        ": amp-bf16 at " + ratio + " fp32's speed)";
  }
  return {chosen, line};
}

} // namespace lamp_examples
