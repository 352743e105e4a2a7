// FP8 recipes and state: the recipe's check, Float8StateImpl, and the
// lookups of a model's converted layers.
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "nn/float8_internal.h"

namespace lamp {
namespace nn {
namespace internal {

const char* scaling_name(Float8Scaling scaling) {
  return scaling == Float8Scaling::kCurrent ? "current" : "delayed";
}

void check_recipe(const Float8Recipe& recipe, const std::string& who) {
  TORCH_CHECK(recipe.scaling() == Float8Scaling::kCurrent ||
                  recipe.scaling() == Float8Scaling::kDelayed,
              who, ": unknown Float8Scaling value.");
  TORCH_CHECK(recipe.amax_compute() == Float8AmaxCompute::kMax ||
                  recipe.amax_compute() == Float8AmaxCompute::kMostRecent,
              who, ": unknown Float8AmaxCompute value.");
  TORCH_CHECK(recipe.amax_history_len() >= 1, who,
              ": amax_history_len must be at least 1, got ",
              recipe.amax_history_len(), ".");
  TORCH_CHECK(
      recipe.margin() >= 0 && recipe.margin() <= 64, who,
      ": margin must be in [0, 64] (the scale is max / amax / 2^margin), got ",
      recipe.margin(), ".");
}

Float8StateImpl* state_of(const torch::nn::Module& layer) {
  for (const auto& child : layer.named_children()) {
    if (child.key() == kStateName) {
      return dynamic_cast<Float8StateImpl*>(child.value().get());
    }
  }
  return nullptr;
}

std::vector<std::pair<std::string, torch::nn::Module*>> modules_of(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{
      {"", const_cast<torch::nn::Module*>(&model)}};
  for (const auto& item :
       model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  return modules;
}

std::vector<Float8StateImpl*> states_of(const torch::nn::Module& model) {
  std::vector<Float8StateImpl*> states;
  for (const auto& item : modules_of(model)) {
    if (auto* state = dynamic_cast<Float8StateImpl*>(item.second)) {
      states.push_back(state);
    }
  }
  return states;
}

} // namespace internal

using namespace internal;

Float8StateImpl::Float8StateImpl(Float8Recipe recipe, std::string name)
    : recipe_(recipe), name_(std::move(name)) {
  check_recipe(recipe_, "lamp::nn::Float8State");
  reset();
}

void Float8StateImpl::reset() {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  scale = torch::ones({kOperands}, f32);
  amax_history =
      torch::zeros({kOperands, recipe_.scaling() == Float8Scaling::kDelayed
                                   ? recipe_.amax_history_len()
                                   : 1},
                   f32);
  pending_amax = torch::zeros({kOperands}, f32);
  counters = torch::zeros({4, kOperands}, f32);
  counters[kLastScale].fill_(1.0);
}

void Float8StateImpl::to(torch::Device device, torch::Dtype /*dtype*/,
                         bool non_blocking) {
  // The state stays FP32 whatever the model is converted to.
  to(device, non_blocking);
}

void Float8StateImpl::to(torch::Dtype /*dtype*/, bool /*non_blocking*/) {}

void Float8StateImpl::to(torch::Device device, bool non_blocking) {
  scale = scale.to(device, non_blocking);
  amax_history = amax_history.to(device, non_blocking);
  pending_amax = pending_amax.to(device, non_blocking);
  counters = counters.to(device, non_blocking);
}

Float8StateImpl* float8_state(const torch::nn::LinearImpl& layer) {
  return state_of(layer);
}

bool has_float8_layers(const torch::nn::Module& model) {
  return !states_of(model).empty();
}

} // namespace nn
} // namespace lamp
