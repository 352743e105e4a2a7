#include "amp/capture_signature.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <sstream>
#include <typeinfo>
#include <utility>

#include "lamp/optim/optimizer.h"
#include "lamp/platform/parameters.h"
#include "platform/number_text.h"

namespace lamp {
namespace detail {
namespace {

// CaptureSignature's entries: a kind in the high bits of Entry::what, a
// field of that kind in the low ones.
enum Kind : uint32_t {
  kMaxGradNorm = 1,
  kScaler,
  kStateVersion,
  kGroupCount,
  kOptionsType,
  kOption,
  kGroupSize,
  kParam,
  kParamStorage,
  kRequiresGrad,
  kModelStorage,
  kBufferStorage,
  kTraining,
};
constexpr uint32_t kFieldBits = 8;

constexpr uint32_t what(Kind kind, uint32_t field = 0) {
  return (static_cast<uint32_t>(kind) << kFieldBits) | field;
}

uint64_t bits(double value) {
  uint64_t out = 0;
  std::memcpy(&out, &value, sizeof out);
  return out;
}

uint64_t address(const void* pointer) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(pointer));
}

// Where a tensor's elements are: a load (set_) or a move (set_data) changes
// it, and a captured graph keeps reading and writing the old place.
uint64_t storage_of(const torch::Tensor& t) {
  const auto* impl = t.defined() ? t.unsafeGetTensorImpl() : nullptr;
  if (impl == nullptr || !impl->has_storage()) {
    return 0;
  }
  return address(impl->storage().data()) +
         static_cast<uint64_t>(impl->storage_offset());
}

enum class Type { kDouble, kBool, kInt };

struct Field {
  const char* name;
  Type type;
};

// The scaler options its captured update bakes in.
constexpr Field kScalerFields[] = {
    {"enabled", Type::kBool},           {"dynamic", Type::kBool},
    {"growth_factor", Type::kDouble},   {"backoff_factor", Type::kDouble},
    {"growth_interval", Type::kInt},    {"hysteresis", Type::kInt},
    {"min_scale", Type::kDouble},       {"max_scale", Type::kDouble},
    {"min_scale_patience", Type::kInt},
};

std::string value_text(Type type, uint64_t value) {
  switch (type) {
    case Type::kBool:
      return value != 0 ? "true" : "false";
    case Type::kInt:
      return std::to_string(static_cast<int64_t>(value));
    case Type::kDouble:
      break;
  }
  double number = 0;
  std::memcpy(&number, &value, sizeof number);
  return exact(number);
}

} // namespace

CaptureSignature::CaptureSignature(
    const std::shared_ptr<torch::nn::Module>& model,
    const TrainStepOptions& options)
    : max_grad_norm_(options.max_grad_norm()) {
  TORCH_INTERNAL_ASSERT(model != nullptr);
  for (const auto& item : model->named_modules()) {
    module_names_.push_back(item.key());
    modules_.push_back(item.value());
  }
  for (const auto& item : unique_named_parameters(*model)) {
    param_names_.push_back(item.key());
    params_.push_back(item.value());
  }
  for (const auto& item : model->named_buffers()) {
    buffer_names_.push_back(item.key());
    buffers_.push_back(item.value());
  }
}

void CaptureSignature::compute(const torch::optim::Optimizer& optimizer,
                               const GradScaler& scaler,
                               std::vector<Entry>& out) const {
  out.clear();
  const auto add = [&out](uint32_t kind_field, size_t group, size_t index,
                          uint64_t value) {
    out.push_back({kind_field, static_cast<uint32_t>(group),
                   static_cast<uint64_t>(index), value});
  };
  add(what(kMaxGradNorm), 0, 0, bits(max_grad_norm_));
  const auto& so = scaler.options();
  const uint64_t scaler_values[] = {
      so.enabled(),
      so.dynamic(),
      bits(so.growth_factor()),
      bits(so.backoff_factor()),
      static_cast<uint64_t>(so.growth_interval()),
      static_cast<uint64_t>(so.hysteresis()),
      bits(so.min_scale()),
      bits(so.max_scale()),
      static_cast<uint64_t>(so.min_scale_patience()),
  };
  for (uint32_t f = 0; f < std::size(scaler_values); ++f) {
    add(what(kScaler, f), 0, 0, scaler_values[f]);
  }
  const auto* on_device = dynamic_cast<const optim::AmpStep*>(&optimizer);
  if (on_device != nullptr) {
    add(what(kStateVersion), 0, 0, on_device->state_version());
  }
  const auto& groups = optimizer.param_groups();
  add(what(kGroupCount), 0, 0, groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    if (group.has_options()) {
      const auto& options = group.options();
      add(what(kOptionsType), g, 0, typeid(options).hash_code());
      // The optimizer says what its captured step bakes in; one that is not
      // an AmpStep cannot be captured (TrainStep refuses it), so only the
      // options' type is watched.
      if (on_device != nullptr) {
        uint64_t k = 0;
        on_device->baked_in_options(
            group, [&](const optim::AmpStep::BakedOption& baked) {
              add(what(kOption), g, k++, bits(baked.value));
            });
      }
    }
    const auto& params = group.params();
    add(what(kGroupSize), g, 0, params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      add(what(kParam), g, i, address(params[i].unsafeGetTensorImpl()));
      add(what(kParamStorage), g, i, storage_of(params[i]));
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    add(what(kRequiresGrad), 0, i, params_[i].requires_grad());
    add(what(kModelStorage), 0, i, storage_of(params_[i]));
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    add(what(kBufferStorage), 0, i, storage_of(buffers_[i]));
  }
  for (size_t i = 0; i < modules_.size(); ++i) {
    add(what(kTraining), 0, i, modules_[i]->is_training());
  }
}

void CaptureSignature::record(const torch::optim::Optimizer& optimizer,
                              const GradScaler& scaler) {
  compute(optimizer, scaler, recorded_);
}

std::string CaptureSignature::changed(const torch::optim::Optimizer& optimizer,
                                      const GradScaler& scaler) {
  compute(optimizer, scaler, scratch_);
  const size_t n = std::min(recorded_.size(), scratch_.size());
  for (size_t i = 0; i < n; ++i) {
    if (!(recorded_[i] == scratch_[i])) {
      return describe(i, scratch_[i], optimizer);
    }
  }
  return recorded_.size() == scratch_.size()
             ? std::string()
             : std::string("the optimizer's param groups");
}

std::string CaptureSignature::describe(
    size_t i, const Entry& now,
    const torch::optim::Optimizer& optimizer) const {
  const auto& before = recorded_[i];
  if (before.what != now.what || before.group != now.group ||
      before.index != now.index) {
    return "the optimizer's param groups";
  }
  const uint32_t kind = now.what >> kFieldBits;
  const uint32_t field = now.what & ((1u << kFieldBits) - 1);
  const auto change = [&](Type type) {
    return " (" + value_text(type, before.value) + " -> " +
           value_text(type, now.value) + ")";
  };
  const auto param_name = [&](size_t i) { return "'" + param_names_[i] + "'"; };
  std::ostringstream out;
  // The parameter's kParam entry (its tensor) is the one before its
  // kParamStorage entry.
  const auto in_group = [&](uint64_t tensor) {
    out << "parameter " << now.index << " of param group " << now.group;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (address(params_[p].unsafeGetTensorImpl()) == tensor) {
        out << " (" << param_name(p) << ")";
      }
    }
  };
  switch (kind) {
    case kMaxGradNorm:
      out << "TrainStepOptions::max_grad_norm" << change(Type::kDouble);
      break;
    case kScaler:
      out << "the GradScaler's " << kScalerFields[field].name
          << change(kScalerFields[field].type);
      break;
    case kStateVersion:
      out << "the optimizer's state (loaded)";
      break;
    case kGroupCount:
      out << "the number of param groups" << change(Type::kInt);
      break;
    case kOptionsType:
      out << "the options type of param group " << now.group;
      break;
    case kOption: {
      // The name and kind of the option, as the optimizer reports it now.
      std::string name = "option " + std::to_string(now.index);
      bool flag = false;
      const auto* on_device = dynamic_cast<const optim::AmpStep*>(&optimizer);
      TORCH_INTERNAL_ASSERT(on_device != nullptr &&
                            now.group < optimizer.param_groups().size());
      uint64_t k = 0;
      on_device->baked_in_options(
          optimizer.param_groups()[now.group],
          [&](const optim::AmpStep::BakedOption& baked) {
            if (k++ == now.index) {
              name = baked.name;
              flag = baked.flag;
            }
          });
      out << "param group " << now.group << "'s " << name
          << change(flag ? Type::kBool : Type::kDouble);
      break;
    }
    case kGroupSize:
      out << "the number of parameters in param group " << now.group
          << change(Type::kInt);
      break;
    case kParam:
      out << "the tensor of ";
      in_group(before.value);
      break;
    case kParamStorage:
      out << "the storage of ";
      in_group(recorded_[i - 1].value);
      out << " (moved or loaded)";
      break;
    case kRequiresGrad:
      out << "requires_grad of parameter " << param_name(now.index)
          << change(Type::kBool);
      break;
    case kModelStorage:
      out << "the storage of parameter " << param_name(now.index)
          << " (moved or loaded)";
      break;
    case kBufferStorage:
      out << "the storage of buffer '" << buffer_names_[now.index]
          << "' (moved or loaded)";
      break;
    case kTraining: {
      const auto& name = module_names_[now.index];
      out << "the train/eval mode of "
          << (name.empty() ? std::string("the model") : "module '" + name + "'")
          << (now.value != 0 ? " (eval -> train)" : " (train -> eval)");
      break;
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "CaptureSignature: unknown entry ", kind);
  }
  return out.str();
}

} // namespace detail
} // namespace lamp
