#include "lamp/optim/sgd.h"

#include <torch/torch.h>

#include <functional>

#include "lamp/platform/parameters.h"
#include "optim/internal.h"
#include "platform/compat.h"

namespace lamp {
namespace optim {
namespace {

using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

constexpr const char* kCaller = "lamp::optim::SGD";

// The momentum buffer of `p`, or an undefined tensor when it has none yet.
torch::Tensor buffer_of(torch::optim::Optimizer& optimizer,
                        const torch::Tensor& p) {
  auto& state = optimizer.state();
  const auto it = state.find(lamp::detail::optimizer_state_key(p));
  return it == state.end()
             ? torch::Tensor()
             : static_cast<SGDParamState&>(*it->second).momentum_buffer();
}

void register_buffer(torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                     torch::Tensor buffer) {
  auto state = std::make_unique<SGDParamState>();
  state->momentum_buffer(std::move(buffer));
  optimizer.state()[lamp::detail::optimizer_state_key(p)] = std::move(state);
}

// Python's _multi_tensor_sgd with torch::optim's rule: out-of-place where
// torch::optim is (the gradients are left as they were).
void foreach_group(torch::optim::Optimizer& optimizer,
                   torch::optim::OptimizerParamGroup& group) {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  for (auto& item : internal::buckets(group, kCaller)) {
    auto& params = item.second.params;
    std::vector<torch::Tensor> d_p = item.second.grads;
    if (o.weight_decay() != 0) {
      d_p = at::_foreach_add(d_p, params, o.weight_decay());
    }
    if (o.momentum() != 0) {
      std::vector<torch::Tensor> old_params, old_d_p, old_buffers;
      std::vector<torch::Tensor> all_buffers;
      for (size_t i = 0; i < params.size(); ++i) {
        auto buffer = buffer_of(optimizer, params[i]);
        if (!buffer.defined()) {
          buffer = torch::clone(d_p[i]).detach();
          register_buffer(optimizer, params[i], buffer);
        } else {
          old_d_p.push_back(d_p[i]);
          old_buffers.push_back(buffer);
        }
        all_buffers.push_back(buffer);
      }
      if (!old_buffers.empty()) {
        at::_foreach_mul_(old_buffers, o.momentum());
        at::_foreach_add_(old_buffers, old_d_p, 1 - o.dampening());
      }
      d_p = o.nesterov() ? at::_foreach_add(d_p, all_buffers, o.momentum())
                         : all_buffers;
    }
    at::_foreach_add_(params, d_p, -o.lr());
  }
}

void fused_group(
    torch::optim::Optimizer& optimizer,
    torch::optim::OptimizerParamGroup& group,
    const std::function<torch::Tensor(const torch::Device&)>& lr_on,
    const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  for (auto& item : internal::buckets(group, kCaller)) {
    auto& params = item.second.params;
    auto& grads = item.second.grads;
    const auto lr = lr_on(params[0].device());
    if (o.momentum() == 0) {
      lamp::detail::fused_sgd_(params, grads, {}, o.weight_decay(), 0.0, o.lr(),
                               lr, o.dampening(), o.nesterov(), false,
                               grad_scale, found_inf);
      continue;
    }
    // The kernel's is_first_step (buffer = gradient) holds for a whole call:
    // parameters with and without buffers go in separate calls.
    std::vector<torch::Tensor> p_old, g_old, b_old, p_new, g_new;
    for (size_t i = 0; i < params.size(); ++i) {
      auto buffer = buffer_of(optimizer, params[i]);
      if (buffer.defined()) {
        p_old.push_back(params[i]);
        g_old.push_back(grads[i]);
        b_old.push_back(buffer);
      } else {
        p_new.push_back(params[i]);
        g_new.push_back(grads[i]);
      }
    }
    if (!p_old.empty()) {
      lamp::detail::fused_sgd_(p_old, g_old, b_old, o.weight_decay(),
                               o.momentum(), o.lr(), lr, o.dampening(),
                               o.nesterov(),
                               /*is_first_step=*/false, grad_scale, found_inf);
    }
    if (p_new.empty()) {
      continue;
    }
    std::vector<torch::Tensor> b_new;
    for (const auto& p : p_new) {
      b_new.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    }
    if (o.dampening() == 0) {
      // From a zero buffer the ordinary update is the first step's
      // (momentum * 0 + g = g), and a skipped step leaves the zeros, so the
      // next one is again a first step: exact, with no host read (Python's
      // fused SGD would keep an uninitialised buffer here).
      lamp::detail::fused_sgd_(p_new, g_new, b_new, o.weight_decay(),
                               o.momentum(), o.lr(), lr, o.dampening(),
                               o.nesterov(), /*is_first_step=*/false,
                               grad_scale, found_inf);
    } else {
      // With dampening the first step differs from the update of a zero
      // buffer: it reads the overflow flag on the host, once, and registers
      // the buffers only when it runs.
      if (found_inf.defined() && found_inf.item<float>() != 0.0f) {
        continue;
      }
      lamp::detail::fused_sgd_(p_new, g_new, b_new, o.weight_decay(),
                               o.momentum(), o.lr(), lr, o.dampening(),
                               o.nesterov(), /*is_first_step=*/true, grad_scale,
                               torch::Tensor());
    }
    for (size_t i = 0; i < p_new.size(); ++i) {
      register_buffer(optimizer, p_new[i], b_new[i]);
    }
  }
}

} // namespace

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
         torch::optim::SGDOptions defaults, Implementation implementation)
    : torch::optim::SGD(
          internal::unique_param_groups(std::move(param_groups), kCaller),
          std::move(defaults)),
      implementation_(implementation) {}

SGD::SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults,
         Implementation implementation)
    : torch::optim::SGD(unique_tensors(std::move(params)), std::move(defaults)),
      implementation_(implementation) {}

Implementation SGD::implementation() const {
  return internal::resolve(implementation_, *this, kCaller);
}

bool SGD::skips_on_device() const {
  return implementation() == Implementation::kFused;
}

torch::Tensor SGD::step(LossClosure closure) {
  auto loss = internal::run_closure(closure);
  run(torch::Tensor(), torch::Tensor());
  return loss;
}

void SGD::step_scaled(const torch::Tensor& grad_scale,
                      const torch::Tensor& found_inf) {
  run(grad_scale, found_inf);
}

void SGD::run(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  const auto implementation = this->implementation();
  if (implementation != Implementation::kFused &&
      !internal::prepare_scaled_step(*this, grad_scale, found_inf)) {
    return;
  }
  torch::NoGradGuard no_grad;
  switch (implementation) {
    case Implementation::kPerTensor:
      torch::optim::SGD::step();
      return;
    case Implementation::kForEach:
      for (auto& group : param_groups()) {
        foreach_group(*this, group);
      }
      return;
    default: {
      auto& groups = param_groups();
      for (size_t g = 0; g < groups.size(); ++g) {
        const double group_lr = groups[g].options().get_lr();
        fused_group(
            *this, groups[g],
            [&](const torch::Device& device) {
              return device_lr_for(g, group_lr, device);
            },
            grad_scale, internal::skip_flag(found_inf));
      }
    }
  }
}

void SGD::refresh_device_lr() {
  AmpStep::refresh_device_lr(*this);
}

} // namespace optim
} // namespace lamp
