// The conversion to FP8: which Linear layers are eligible, and
// convert_to_float8() and float8_left_out().
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nn/float8_internal.h"

namespace lamp {
namespace nn {

using namespace internal;

namespace {

using Holders = std::unordered_map<const void*, int>;

// How many modules hold each parameter: a weight shared with another module
// (tied embeddings) stays out of FP8.
Holders holders_of(
    const std::vector<std::pair<std::string, torch::nn::Module*>>& modules) {
  Holders holders;
  for (const auto& item : modules) {
    for (const auto& p : item.second->named_parameters(/*recurse=*/false)) {
      ++holders[p.value().unsafeGetTensorImpl()];
    }
  }
  return holders;
}

// Why `layer` cannot compute in FP8 ("" when it can): what
// convert_to_float8() and float8_left_out() say of it.
std::string ineligible_reason(const torch::nn::LinearImpl& layer,
                              const Holders& holders) {
  const auto& weight = layer.weight;
  const int64_t out = weight.size(0), in = weight.size(1);
  if (!(weight.scalar_type() == torch::kFloat ||
        is_low_precision(weight.scalar_type()))) {
    return std::string("its weight is ") + c10::toString(weight.scalar_type()) +
           "; FP8 layers take FP32, BF16 or FP16 weights";
  }
  if (in == 0 || out == 0) {
    return "its weight is [" + std::to_string(out) + ", " + std::to_string(in) +
           "]; a layer without in or out features has no product to compute "
           "in FP8";
  }
  if (in % 16 != 0 || out % 16 != 0) {
    return "its weight is [" + std::to_string(out) + ", " + std::to_string(in) +
           "]; CUDA's FP8 products need in and out features that are "
           "multiples of 16";
  }
  const auto found = holders.find(weight.unsafeGetTensorImpl());
  if (found != holders.end() && found->second > 1) {
    return "its weight is shared with another module (tied); it would be "
           "cast once per use";
  }
  return "";
}

} // namespace

std::vector<std::pair<std::string, std::string>> float8_left_out(
    const torch::nn::Module& model) {
  const auto modules = modules_of(model);
  const auto holders = holders_of(modules);
  std::vector<std::pair<std::string, std::string>> left_out;
  for (const auto& item : modules) {
    const auto* linear =
        dynamic_cast<const torch::nn::LinearImpl*>(item.second);
    if (linear == nullptr || state_of(*linear) != nullptr) {
      continue;
    }
    std::string why = ineligible_reason(*linear, holders);
    left_out.emplace_back(item.first, why.empty()
                                          ? "left out by the conversion's "
                                            "predicate (eligible otherwise)"
                                          : std::move(why));
  }
  return left_out;
}

Float8Conversion convert_to_float8(torch::nn::Module& model,
                                   const Float8Recipe& recipe,
                                   const Float8Predicate& predicate) {
  const char* who = "lamp::nn::convert_to_float8";
  check_recipe(recipe, who);
  const auto modules = modules_of(model);
  for (const auto& item : modules) {
    if (dynamic_cast<Float8StateImpl*>(item.second) == nullptr) {
      continue;
    }
    // The state is the child "float8" of its layer; a model that is itself
    // a Linear holds it at the top ("float8", no dot).
    const auto dot = item.first.rfind('.');
    TORCH_CHECK(false, who, ": the model is converted already (",
                dot == std::string::npos
                    ? std::string("the model itself")
                    : "layer '" + item.first.substr(0, dot) + "'",
                " has an FP8 state); convert it once.");
  }
  const auto holders = holders_of(modules);
  Float8Conversion result;
  bool checked_device = false;
  for (const auto& item : modules) {
    auto* linear = dynamic_cast<torch::nn::LinearImpl*>(item.second);
    if (linear == nullptr) {
      continue;
    }
    const auto& name = item.first;
    if (predicate && !predicate(name, *linear)) {
      result.skipped.emplace_back(name, "left out by the predicate");
      continue;
    }
    const auto& weight = linear->weight;
    const auto why = ineligible_reason(*linear, holders);
    if (!why.empty()) {
      result.skipped.emplace_back(name, why);
      continue;
    }
    if (!checked_device) {
      const auto reason = float8_unavailable_reason(weight.device());
      TORCH_CHECK(reason.empty(), who, ": FP8 cannot run: ", reason, ".");
      checked_device = true;
    }
    auto state = Float8State(recipe, name);
    state->to(weight.device());
    linear->register_module(kStateName, state);
    result.converted.push_back(name);
  }
  return result;
}

} // namespace nn
} // namespace lamp
