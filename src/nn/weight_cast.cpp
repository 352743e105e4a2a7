#include "lamp/nn/weight_cast.h"

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "lamp/nn/float8.h"
#include "platform/autocast_on.h"
#include "platform/compat.h"

namespace lamp {
namespace nn {
namespace {

// The calling thread's innermost live guard (autocast's state is per thread
// too, and the casts are only valid inside its region).
thread_local CastWeightsOnce* innermost = nullptr;

// Every tensor of `inputs` cast to `dtype` in one foreach copy.
torch::autograd::variable_list cast_all(at::TensorList inputs,
                                        at::ScalarType dtype) {
  torch::autograd::variable_list outputs;
  outputs.reserve(inputs.size());
  for (const auto& input : inputs) {
    outputs.push_back(torch::empty_like(input, input.options().dtype(dtype)));
  }
  lamp::detail::foreach_copy_(outputs, inputs);
  return outputs;
}

// Every input cast to `dtype` in one foreach copy; in the backward every
// defined gradient cast back to the inputs' dtype in one. One node for all
// the casts, so that the backward's casts wait for the last gradient and run
// together.
class CastAllFunction : public torch::autograd::Function<CastAllFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, at::TensorList inputs,
      at::ScalarType dtype) {
    // A layer left out of the forward sends no gradient: none comes back,
    // rather than a cast of zeros.
    ctx->set_materialize_grads(false);
    ctx->saved_data["input_dtype"] =
        static_cast<int64_t>(inputs.front().scalar_type());
    return cast_all(inputs, dtype);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const auto dtype =
        static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    if (torch::GradMode::is_enabled()) {
      // create_graph=true: each cast back as a differentiable op (a cast is
      // linear), so that higher-order gradients flow through it as through
      // autocast's casts.
      torch::autograd::variable_list result;
      for (const auto& grad : grads) {
        result.push_back(grad.defined() ? grad.to(dtype) : torch::Tensor());
      }
      result.emplace_back(); // `dtype` is not differentiable
      return result;
    }
    std::vector<torch::Tensor> defined;
    for (const auto& grad : grads) {
      if (grad.defined()) {
        defined.push_back(grad);
      }
    }
    const auto casts = defined.empty() ? torch::autograd::variable_list()
                                       : cast_all(defined, dtype);
    torch::autograd::variable_list result(grads.size());
    for (size_t i = 0, next = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) {
        result[i] = casts[next++];
      }
    }
    result.emplace_back(); // `dtype` is not differentiable
    return result;
  }
};

// Whether autocast would cast `t` for a linear: an FP32 tensor on a device
// where autocast is on (CPU or CUDA).
bool autocast_casts(const torch::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kFloat) {
    return false;
  }
  return lamp::detail::autocast_on(t.device().type());
}

// The tensors one foreach copy casts: one device, and all of them sending
// their gradients back, or none (frozen layers: a cast without an autograd
// node, so that no weight gradient is computed for a layer that does not
// want one, as autocast's own cast would not).
struct CastGroup {
  torch::Device device;
  bool differentiable;
  torch::autograd::variable_list tensors;
};

} // namespace

CastWeightsOnce::CastWeightsOnce(torch::nn::Module& module)
    : outer_(innermost) {
  std::vector<CastGroup> groups;
  const auto add = [&](const torch::Tensor& t) {
    if (!autocast_casts(t) ||
        !casts_.emplace(t.unsafeGetTensorImpl(), torch::Tensor()).second) {
      return; // not autocast's to cast, or already listed (a shared layer)
    }
    // (Without grad mode Function::apply records no node either.)
    const bool differentiable = t.requires_grad();
    for (auto& group : groups) {
      if (group.device == t.device() &&
          group.differentiable == differentiable) {
        group.tensors.push_back(t);
        return;
      }
    }
    groups.push_back({t.device(), differentiable, {t}});
  };
  // apply() rather than modules(): it takes a module not held by a
  // shared_ptr too.
  module.apply([&](torch::nn::Module& child) {
    const auto* layer = dynamic_cast<const torch::nn::LinearImpl*>(&child);
    if (layer != nullptr && float8_state(*layer) == nullptr) {
      add(layer->weight);
      add(layer->bias);
    }
  });
  for (const auto& group : groups) {
    const auto dtype = lamp::detail::autocast_dtype(group.device.type());
    torch::autograd::variable_list casts;
    if (group.differentiable) {
      // A TensorList, not a vector: what Function::apply records as inputs.
      casts = CastAllFunction::apply(at::TensorList(group.tensors), dtype);
    } else {
      torch::NoGradGuard no_grad;
      casts = cast_all(group.tensors, dtype);
    }
    for (size_t i = 0; i < casts.size(); ++i) {
      casts_[group.tensors[i].unsafeGetTensorImpl()] = casts[i];
    }
  }
  if (outer_ != nullptr) {
    outer_->inner_ = this;
  }
  innermost = this;
}

CastWeightsOnce::~CastWeightsOnce() {
  // Unlinked wherever it stands: guards held in optionals or on the heap can
  // end before one made after them, which must neither lose its place nor
  // be left pointing at this one.
  if (inner_ != nullptr) {
    inner_->outer_ = outer_;
  } else if (innermost == this) {
    innermost = outer_;
  }
  if (outer_ != nullptr) {
    outer_->inner_ = inner_;
  }
}

torch::Tensor CastWeightsOnce::find(const torch::Tensor& parameter) const {
  if (!parameter.defined()) {
    return {};
  }
  const auto found = casts_.find(parameter.unsafeGetTensorImpl());
  return found == casts_.end() ? torch::Tensor() : found->second;
}

torch::Tensor cast_weight(const torch::Tensor& parameter) {
  for (const auto* guard = innermost; guard != nullptr; guard = guard->outer_) {
    auto cast = guard->find(parameter);
    if (!cast.defined()) {
      continue;
    }
    // Still what autocast would cast it to: not where a region inside the
    // guard's turned autocast off or changed its dtype, or after the
    // module moved (Module::to keeps the parameter's TensorImpl). There
    // autocast's own cast, or none, is the right one.
    const auto device = parameter.device().type();
    if (parameter.scalar_type() == at::kFloat &&
        cast.device() == parameter.device() &&
        lamp::detail::autocast_on(device) &&
        lamp::detail::autocast_dtype(device) == cast.scalar_type()) {
      return cast;
    }
    return parameter;
  }
  return parameter;
}

std::string cast_weights_once_path(const torch::Device& device) {
  if (!LAMP_TORCH_FOREACH_COPY) {
    return std::string("a copy per tensor: LibTorch ") + TORCH_VERSION +
           " has no at::_foreach_copy_";
  }
  if (device.is_cuda()) {
    return "multi-tensor kernels each way (at::_foreach_copy_)";
  }
  return "at::_foreach_copy_, a copy per tensor on " + device.str();
}

} // namespace nn
} // namespace lamp
