// GradScaler's state: the archive (torch::save) and Python's state dict
// (`torch.amp.GradScaler.state_dict()`'s keys, pickled as Python writes it),
// each read and checked whole before the scaler changes.
#include "lamp/amp/grad_scaler.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "amp/grad_scaler_options.h"
#include "lamp/platform/checkpoint_file.h"
#include "platform/archive.h"
#include "platform/checkpoint_io.h"

namespace lamp {

c10::Dict<std::string, c10::IValue> GradScaler::state(
    bool with_lamp_keys) const {
  // Dict<_, IValue> has no default constructor: it needs the value type.
  auto state = c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  if (!options_.enabled()) {
    return state;
  }
  state.insert("scale", get_scale());
  state.insert("growth_factor", options_.growth_factor());
  state.insert("backoff_factor", options_.backoff_factor());
  state.insert("growth_interval", options_.growth_interval());
  state.insert("_growth_tracker", growth_tracker());
  if (with_lamp_keys) {
    state.insert("min_scale", options_.min_scale());
    state.insert("max_scale", options_.max_scale());
    state.insert("hysteresis", options_.hysteresis());
    state.insert("_overflow_count",
                 overflow_count_.defined()
                     ? static_cast<int64_t>(overflow_count_.item<int>())
                     : init_overflow_count_);
    state.insert("dynamic", options_.dynamic());
    state.insert("min_scale_patience", options_.min_scale_patience());
    state.insert("_min_scale_overflows", min_scale_overflows());
  }
  return state;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  for (const auto& item : state(/*with_lamp_keys=*/true)) {
    archive.write(item.key(), item.value());
  }
}

c10::Dict<std::string, c10::IValue> GradScaler::state_dict() const {
  auto full = state(/*with_lamp_keys=*/true);
  if (full.empty()) {
    return full;
  }
  // Python's keys alone where lamp's hold what Python's scaler does anyway,
  // so that a default scaler's file equals Python's. With hysteresis 1 the
  // overflow count decides nothing (every overflow backs off), and whether
  // it reads 0 or 1 after an overflow depends on the update's path (the
  // portable update counts it, ATen's fused one does not).
  const bool as_python = full.at("min_scale").toDouble() == 0.0 &&
                         std::isinf(full.at("max_scale").toDouble()) &&
                         full.at("hysteresis").toInt() == 1 &&
                         full.at("dynamic").toBool() &&
                         full.at("min_scale_patience").toInt() == 0 &&
                         full.at("_min_scale_overflows").toInt() == 0;
  return as_python ? state(/*with_lamp_keys=*/false) : full;
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  c10::IValue scale;
  const auto keys = archive.keys();
  if (options_.enabled() && !keys.empty() &&
      !archive.try_read("scale", scale)) {
    // Another archive (a module's, a TrainStep's), not an empty one.
    std::string held;
    for (const auto& key : keys) {
      held += (held.empty() ? "'" : ", '") + key + "'";
    }
    TORCH_CHECK(false,
                "lamp::GradScaler::load: the archive holds no GradScaler "
                "state (its 'scale', '_growth_tracker', ...); its keys are ",
                held,
                ". Give the archive the scaler was saved to (a TrainStep's "
                "checkpoint is loaded by TrainStep::load).");
  }
  load_from(archive, "lamp::GradScaler::load");
}

void GradScaler::load_state_dict(
    const c10::Dict<std::string, c10::IValue>& state) {
  detail::DictReader reader(c10::impl::toGenericDict(state));
  load_from(reader, "lamp::GradScaler::load_state_dict");
}

void GradScaler::save_state_dict(const std::string& path) const {
  check_checkpoint_path(path, "lamp::GradScaler::save_state_dict");
  save_pickle(state_dict(), path);
}

void GradScaler::load_state_dict(const std::string& path) {
  constexpr const char* kCaller = "lamp::GradScaler::load_state_dict";
  c10::IValue value;
  try {
    value = load_pickle(path, kCaller);
  } catch (const c10::Error&) {
    // A whole Python checkpoint (the model's and optimizer's tensors beside
    // the scaler's state) that LibTorch's unpickler does not read: its
    // plain values, the tensors as None, are enough to find the scaler.
    auto skeleton = detail::read_pickle_skeleton(path, kCaller);
    if (!skeleton || !skeleton->isGenericDict()) {
      throw;
    }
    value = std::move(*skeleton);
  }
  TORCH_CHECK(
      value.isGenericDict(), kCaller, ": ", path, " holds a ", value.tagKind(),
      ", not a dict; write it with torch.save(scaler.state_dict(), path).");
  auto dict = value.toGenericDict();
  // Python's training checkpoints keep the scaler's state under "scaler"
  // (torch.save({"model": ..., "scaler": scaler.state_dict()}, path)).
  if (!dict.contains("scale") && dict.contains("scaler") &&
      dict.at("scaler").isGenericDict()) {
    dict = dict.at("scaler").toGenericDict();
  }
  if (!dict.contains("scale") && !dict.empty()) {
    std::string keys;
    for (const auto& item : dict) {
      keys += (keys.empty() ? "" : ", ") +
              (item.key().isString() ? "'" + item.key().toStringRef() + "'"
                                     : std::string("a non-string key"));
    }
    TORCH_CHECK(false, kCaller, ": ", path,
                " holds no GradScaler state: neither a scaler's state_dict() "
                "(its 'scale', '_growth_tracker', ...) nor one under "
                "'scaler'; its keys are ",
                keys,
                ". Save the scaler's own state with torch.save("
                "scaler.state_dict(), path), or keep it in the checkpoint as "
                "checkpoint['scaler'].");
  }
  detail::DictReader reader(dict);
  load_from(reader, kCaller);
}

template <typename Source>
void GradScaler::load_from(Source& source, const char* caller) {
  if (!options_.enabled()) {
    return;
  }
  c10::IValue value;
  TORCH_CHECK(
      source.try_read("scale", value), caller,
      ": the state has no 'scale', possibly because it was saved from a disabled GradScaler (whose state is empty).");
  // Everything is read and checked before anything changes.
  GradScalerOptions options = options_;
  const double scale = detail::read_number(source, "scale", caller);
  options.growth_factor(detail::read_number(source, "growth_factor", caller));
  options.backoff_factor(detail::read_number(source, "backoff_factor", caller));
  options.growth_interval(detail::read_int(source, "growth_interval", caller));
  int64_t tracker = detail::read_int(source, "_growth_tracker", caller);
  int64_t overflow_count = 0;
  // lamp's own keys are optional, so a state saved by Python loads too.
  if (source.try_read("min_scale", value)) {
    options.min_scale(detail::read_number(source, "min_scale", caller));
  }
  if (source.try_read("max_scale", value)) {
    options.max_scale(detail::read_number(source, "max_scale", caller));
  }
  if (source.try_read("hysteresis", value)) {
    options.hysteresis(detail::read_int(source, "hysteresis", caller));
  }
  if (source.try_read("_overflow_count", value)) {
    overflow_count = detail::read_int(source, "_overflow_count", caller);
  }
  if (source.try_read("dynamic", value)) {
    options.dynamic(detail::read_bool(source, "dynamic", caller));
  }
  if (source.try_read("min_scale_patience", value)) {
    options.min_scale_patience(
        detail::read_int(source, "min_scale_patience", caller));
  }
  int64_t min_scale_overflows = 0;
  if (source.try_read("_min_scale_overflows", value)) {
    min_scale_overflows =
        detail::read_int(source, "_min_scale_overflows", caller);
  }
  detail::check_options(options, scale, caller);
  // The tracker lives in an int32 tensor, as Python's does.
  TORCH_CHECK(tracker >= 0 && tracker <= std::numeric_limits<int32_t>::max(),
              caller, ": _growth_tracker is ", tracker,
              ", outside [0, 2^31 - 1]; the state is corrupt or from another "
              "scaler.");
  // The count saturates at hysteresis.
  TORCH_CHECK(overflow_count >= 0 && overflow_count <= options.hysteresis(),
              caller, ": _overflow_count is ", overflow_count,
              ", outside [0, hysteresis=", options.hysteresis(),
              "]; the state is corrupt or from another scaler.");

  // An int32 tensor; a count at or past the patience stops at the next check.
  TORCH_CHECK(min_scale_overflows >= 0 &&
                  min_scale_overflows <= std::numeric_limits<int32_t>::max(),
              caller, ": _min_scale_overflows is ", min_scale_overflows,
              ", outside [0, 2^31 - 1]; the state is corrupt.");

  // Every check has passed (a refused load says nothing of the tracker).
  // update() grows the scale when the tracker reaches growth_interval. One
  // at or past it comes from Python's set_growth_interval() lowering the
  // interval (Python's scaler then never grows again until an overflow);
  // it is clamped as lamp's set_growth_interval() clamps it: the next
  // finite step grows the scale.
  if (tracker >= options.growth_interval()) {
    TORCH_WARN(caller, ": _growth_tracker is ", tracker,
               ", at or past growth_interval=", options.growth_interval(),
               " (the interval was lowered after the tracker counted); it "
               "is taken as ",
               options.growth_interval() - 1,
               ", as set_growth_interval() does: the next step without an "
               "overflow grows the scale.");
    tracker = options.growth_interval() - 1;
  }
  options_ = options;
  init_scale_ = scale;
  init_min_scale_overflows_ = min_scale_overflows;
  init_growth_tracker_ = tracker;
  init_overflow_count_ = overflow_count;
  states_.clear();
  if (scale_.defined()) {
    // In place: the checks above keep every value within its tensor's dtype.
    scale_.fill_(init_scale_);
    growth_tracker_.fill_(init_growth_tracker_);
    overflow_count_.fill_(init_overflow_count_);
    min_scale_overflows_.fill_(init_min_scale_overflows_);
  }
}

} // namespace lamp
