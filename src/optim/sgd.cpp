#include "lamp/optim/sgd.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

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

// Parameters of one bucket whose buffers may still wait for their first
// step, sharing one flag.
struct Pending {
  torch::Tensor flag;
  std::vector<torch::Tensor> params, grads, buffers;
};

// Exactly one of the two kernels runs where the step is taken: the first
// step (buf = g) while `flag` is 1, the update after it; a skipped step
// runs neither and leaves the flag as it was. No host read: the fused
// kernels skip where their found_inf is 1 (both are 0/1 here).
template <typename Call>
void first_step_or_update(Pending& pending, const torch::Tensor& found_inf,
                          const Call& call) {
  const auto skip =
      found_inf.defined() ? found_inf : torch::zeros_like(pending.flag);
  call(pending, /*is_first_step=*/true, torch::maximum(skip, 1 - pending.flag));
  call(pending, /*is_first_step=*/false, torch::maximum(skip, pending.flag));
  pending.flag.mul_(skip);
}

// One bucket's parameters by the state of their momentum buffers. The
// kernel's is_first_step (buffer = gradient) holds for a whole call: each
// part goes in calls of its own.
struct Parts {
  // Buffers that steps have taken.
  std::vector<torch::Tensor> p_old, g_old, b_old;
  // No buffer yet.
  std::vector<torch::Tensor> p_new, g_new;
  // Buffers that may wait for their first step, by flag.
  std::vector<Pending> pending;
};

Parts split(torch::optim::Optimizer& optimizer,
            const std::vector<torch::Tensor>& params,
            const std::vector<torch::Tensor>& grads,
            const detail::FirstSteps& first_steps) {
  Parts parts;
  for (size_t i = 0; i < params.size(); ++i) {
    auto buffer = buffer_of(optimizer, params[i]);
    if (!buffer.defined()) {
      parts.p_new.push_back(params[i]);
      parts.g_new.push_back(grads[i]);
      continue;
    }
    const auto first = first_steps.find(params[i].unsafeGetTensorImpl());
    if (first == first_steps.end()) {
      parts.p_old.push_back(params[i]);
      parts.g_old.push_back(grads[i]);
      parts.b_old.push_back(buffer);
      continue;
    }
    const auto& flag = first->second.second;
    auto& pending = parts.pending;
    auto same =
        std::find_if(pending.begin(), pending.end(),
                     [&](const Pending& p) { return p.flag.is_same(flag); });
    if (same == pending.end()) {
      pending.push_back({flag, {}, {}, {}});
      same = pending.end() - 1;
    }
    same->params.push_back(params[i]);
    same->grads.push_back(grads[i]);
    same->buffers.push_back(buffer);
  }
  return parts;
}

void fused_group(
    torch::optim::Optimizer& optimizer,
    torch::optim::OptimizerParamGroup& group, detail::FirstSteps& first_steps,
    const std::function<torch::Tensor(const torch::Device&)>& lr_on,
    const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  for (auto& item : internal::buckets(group, kCaller)) {
    auto& params = item.second.params;
    auto& grads = item.second.grads;
    const auto lr = lr_on(params[0].device());
    const auto sgd = [&](at::TensorList p, at::TensorList g, at::TensorList b,
                         bool is_first_step, const torch::Tensor& skip) {
      lamp::detail::fused_sgd_(p, g, b, o.weight_decay(), o.momentum(), o.lr(),
                               lr, o.dampening(), o.nesterov(), is_first_step,
                               grad_scale, skip);
    };
    if (o.momentum() == 0) {
      sgd(params, grads, {}, false, found_inf);
      continue;
    }
    auto parts = split(optimizer, params, grads, first_steps);
    if (!parts.p_old.empty()) {
      sgd(parts.p_old, parts.g_old, parts.b_old, false, found_inf);
    }
    const auto& p_new = parts.p_new;
    const auto& g_new = parts.g_new;
    if (!p_new.empty()) {
      internal::check_not_capturing(p_new[0], kCaller);
      std::vector<torch::Tensor> b_new;
      for (const auto& p : p_new) {
        b_new.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        register_buffer(optimizer, p, b_new.back());
      }
      if (o.dampening() == 0) {
        // From a zero buffer the ordinary update is the first step's
        // (momentum * 0 + g = g), and a skipped step leaves the zeros, so the
        // next one is again a first step: exact, with no host read (Python's
        // fused SGD would keep an uninitialised buffer here).
        sgd(p_new, g_new, b_new, false, found_inf);
      } else if (!found_inf.defined()) {
        // Nothing can skip this step: it is the first one.
        sgd(p_new, g_new, b_new, true, found_inf);
      } else {
        // With dampening the first step differs from the update of a zero
        // buffer (buf = g, not (1 - dampening) * g): whether this step is
        // taken is known on the device only.
        Pending made{torch::ones({1}, p_new[0].options().dtype(torch::kFloat)),
                     p_new, g_new, b_new};
        for (const auto& p : p_new) {
          first_steps[p.unsafeGetTensorImpl()] = {p, made.flag};
        }
        parts.pending.push_back(std::move(made));
      }
    }
    for (auto& p : parts.pending) {
      first_step_or_update(
          p, found_inf,
          [&](Pending& q, bool is_first_step, const torch::Tensor& skip) {
            sgd(q.params, q.grads, q.buffers, is_first_step, skip);
          });
    }
  }
}

} // namespace

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
         torch::optim::SGDOptions defaults, Implementation implementation)
    : FusedOptimizer(implementation, kCaller,
                     std::vector<torch::optim::OptimizerParamGroup>{},
                     std::move(defaults)) {
  internal::add_param_groups_as_given(*this, std::move(param_groups), kCaller);
  internal::check_param_groups(*this, kCaller);
}

SGD::SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults,
         Implementation implementation)
    : FusedOptimizer(implementation, kCaller, unique_tensors(std::move(params)),
                     std::move(defaults)) {
  internal::check_param_groups(*this, kCaller);
}

void SGD::step_scaled(const torch::Tensor& grad_scale,
                      const torch::Tensor& found_inf) {
  run(grad_scale, found_inf);
}

void SGD::run(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  internal::check_param_groups(*this, kCaller);
  const auto implementation = this->implementation();
  if (implementation != Implementation::kFused) {
    settle_first_steps();
    if (!internal::prepare_scaled_step(*this, grad_scale, found_inf)) {
      return;
    }
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
            *this, groups[g], first_steps_,
            [&](const torch::Device& device) {
              return device_lr_for(g, group_lr, device);
            },
            grad_scale, internal::skip_flag(found_inf));
      }
    }
  }
}

namespace {

// Whether the flag of a buffer says no step has taken it (a host read, once
// per flag in `read`).
bool untaken(const torch::Tensor& flag,
             std::unordered_map<const c10::TensorImpl*, bool>& read) {
  const auto it = read.find(flag.unsafeGetTensorImpl());
  if (it != read.end()) {
    return it->second;
  }
  const bool value = flag.item<float>() != 0.0f;
  read.emplace(flag.unsafeGetTensorImpl(), value);
  return value;
}

} // namespace

void SGD::settle_first_steps() {
  std::unordered_map<const c10::TensorImpl*, bool> read;
  for (const auto& item : first_steps_) {
    const auto& p = item.second.first;
    if (untaken(item.second.second, read)) {
      state().erase(lamp::detail::optimizer_state_key(p));
    }
  }
  first_steps_.clear();
}

void SGD::save(torch::serialize::OutputArchive& archive) const {
  auto& self = const_cast<SGD&>(*this);
  auto& state = self.state();
  // Buffers that no step has taken are left out (torch::optim makes the
  // buffer at the first step taken), but kept here: a captured CUDA graph
  // holds them.
  using Key = std::decay_t<decltype(state.begin()->first)>;
  std::vector<
      std::pair<Key, std::unique_ptr<torch::optim::OptimizerParamState>>>
      parked;
  std::unordered_map<const c10::TensorImpl*, bool> read;
  for (auto it = first_steps_.begin(); it != first_steps_.end();) {
    if (!untaken(it->second.second, read)) {
      // Taken: an ordinary buffer from now on (the flag stays 0).
      it = first_steps_.erase(it);
      continue;
    }
    const auto key = lamp::detail::optimizer_state_key(it->second.first);
    const auto found = state.find(key);
    if (found != state.end()) {
      parked.emplace_back(key, std::move(found->second));
      state.erase(found);
    }
    ++it;
  }
  const auto put_back = [&] {
    for (auto& item : parked) {
      state[item.first] = std::move(item.second);
    }
  };
  try {
    torch::optim::SGD::save(archive);
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
}

void SGD::load(torch::serialize::InputArchive& archive) {
  // A buffer no step has taken is not saved: replaced, not kept beside the
  // cleared flags (the next step would update it as a taken one).
  internal::load_replacing_state(*this,
                                 [&] { torch::optim::SGD::load(archive); });
  first_steps_.clear();
  state_replaced();
}

void SGD::baked_in_options(const torch::optim::OptimizerParamGroup& group,
                           BakedOptionVisitor visit) const {
  const auto& o = static_cast<const SGDOptions&>(group.options());
  visit({"momentum", o.momentum()});
  visit({"dampening", o.dampening()});
  visit({"weight_decay", o.weight_decay()});
  visit({"nesterov", o.nesterov() ? 1.0 : 0.0, /*flag=*/true});
}

} // namespace optim
} // namespace lamp
