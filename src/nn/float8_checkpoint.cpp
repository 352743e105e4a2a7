// The FP8 state in checkpoints: save_float8_state(), and its checked
// read by check_float8_state() and load_float8_state().
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "nn/float8_internal.h"

namespace lamp {
namespace nn {

using namespace internal;

void save_float8_state(const torch::nn::Module& model,
                       torch::serialize::OutputArchive& archive) {
  for (auto* state : states_of(model)) {
    const auto prefix = std::string("float8/") + state->name() + "/";
    const auto& r = state->recipe();
    archive.write(
        prefix + "recipe",
        torch::tensor({static_cast<int64_t>(r.scaling()), r.amax_history_len(),
                       static_cast<int64_t>(r.amax_compute()), r.margin()}));
    archive.write(prefix + "scale", state->scale.cpu());
    archive.write(prefix + "amax_history", state->amax_history.cpu());
    archive.write(prefix + "pending_amax", state->pending_amax.cpu());
    archive.write(prefix + "counters", state->counters.cpu());
  }
}

namespace {

// What save_float8_state() wrote for each converted layer of `model`, read
// and checked; nothing loaded.
std::vector<std::pair<Float8StateImpl*, std::vector<torch::Tensor>>>
read_float8_state(const torch::nn::Module& model,
                  torch::serialize::InputArchive& archive, const char* who) {
  std::vector<std::pair<Float8StateImpl*, std::vector<torch::Tensor>>> read;
  // Both ways: a layer saved in FP8 that this model computes otherwise
  // would lose its scales and history without a word.
  std::set<std::string> converted;
  for (const auto* state : states_of(model)) {
    converted.insert(state->name());
  }
  const std::string head = "float8/", tail = "/recipe";
  for (const auto& key : archive.keys()) {
    if (key.size() <= head.size() + tail.size() ||
        key.compare(0, head.size(), head) != 0 ||
        key.compare(key.size() - tail.size(), tail.size(), tail) != 0) {
      continue;
    }
    const auto name =
        key.substr(head.size(), key.size() - head.size() - tail.size());
    TORCH_CHECK(converted.count(name) != 0, who,
                ": the archive has FP8 state for layer '", name,
                "', which this model does not compute in FP8; convert the "
                "model as it was when saved (the same predicate, dtypes and "
                "sizes).");
  }
  for (auto* state : states_of(model)) {
    const auto prefix = std::string("float8/") + state->name() + "/";
    torch::Tensor recipe;
    TORCH_CHECK(archive.try_read(prefix + "recipe", recipe), who,
                ": the archive has no FP8 state for layer '", state->name(),
                "'; it was saved from a model converted otherwise (or not at "
                "all). Convert the model as it was when saved.");
    const auto& r = state->recipe();
    const auto want =
        torch::tensor({static_cast<int64_t>(r.scaling()), r.amax_history_len(),
                       static_cast<int64_t>(r.amax_compute()), r.margin()});
    const bool same = recipe.sizes() == want.sizes() &&
                      recipe.scalar_type() == want.scalar_type() &&
                      torch::equal(recipe, want);
    if (!same) {
      const auto field = [&](int64_t i) {
        return recipe.dim() == 1 && recipe.numel() == 4 &&
                       recipe.scalar_type() == torch::kLong
                   ? std::to_string(recipe[i].item<int64_t>())
                   : std::string("?");
      };
      TORCH_CHECK(false, who, ": layer '", state->name(),
                  "' was saved with recipe (scaling ", field(0), ", history ",
                  field(1), ", amax_compute ", field(2), ", margin ", field(3),
                  ") but is converted with (scaling ", want[0].item<int64_t>(),
                  " = ", scaling_name(r.scaling()), ", history ",
                  r.amax_history_len(), ", amax_compute ",
                  want[2].item<int64_t>(), ", margin ", r.margin(),
                  "); convert it with the recipe it was saved with.");
    }
    std::vector<torch::Tensor> tensors;
    for (const auto* part : {&state->scale, &state->amax_history,
                             &state->pending_amax, &state->counters}) {
      const char* key = part == &state->scale          ? "scale"
                        : part == &state->amax_history ? "amax_history"
                        : part == &state->pending_amax ? "pending_amax"
                                                       : "counters";
      torch::Tensor t;
      TORCH_CHECK(archive.try_read(prefix + key, t), who, ": layer '",
                  state->name(), "' lacks its ", key,
                  " in the archive (damaged?).");
      TORCH_CHECK(
          t.sizes() == part->sizes() && t.scalar_type() == part->scalar_type(),
          who, ": layer '", state->name(), "': ", key, " is ", t.sizes(), " ",
          t.scalar_type(), ", expected ", part->sizes(), " ",
          part->scalar_type(), " (damaged archive?).");
      // The values too: a scale of 0 or NaN casts every value to 0 or
      // NaN, and a non-finite amax in the history (which the steps never
      // put there) sets the scale to 0, or keeps it, for as many steps as
      // the history holds.
      const bool scale = part == &state->scale;
      const auto values = t.to(torch::kDouble);
      const auto bad = torch::isfinite(values).logical_not().logical_or(
          scale ? values.le(0) : values.lt(0));
      TORCH_CHECK(
          !bad.any().item<bool>(), who, ": layer '", state->name(), "': its ",
          key, " holds ", values.masked_select(bad)[0].item<double>(),
          ", where a ",
          scale ? "scale is finite and > 0" : "value is finite and >= 0",
          "; the archive is damaged: load an intact copy.");
      tensors.push_back(t);
    }
    read.emplace_back(state, std::move(tensors));
  }
  return read;
}

} // namespace

void check_float8_state(const torch::nn::Module& model,
                        torch::serialize::InputArchive& archive) {
  read_float8_state(model, archive, "lamp::nn::check_float8_state");
}

void load_float8_state(torch::nn::Module& model,
                       torch::serialize::InputArchive& archive) {
  // Every layer read and checked before the first is loaded.
  const auto read =
      read_float8_state(model, archive, "lamp::nn::load_float8_state");
  torch::NoGradGuard no_grad;
  for (const auto& item : read) {
    auto* state = item.first;
    state->scale.copy_(item.second[0]);
    state->amax_history.copy_(item.second[1]);
    state->pending_amax.copy_(item.second[2]);
    state->counters.copy_(item.second[3]);
  }
}

} // namespace nn
} // namespace lamp
