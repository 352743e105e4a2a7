#include "lamp/optim/adam.h"

#include <torch/torch.h>

#include <cmath>
#include <tuple>
#include <type_traits>

#include "lamp/platform/parameters.h"
#include "optim/internal.h"
#include "platform/compat.h"

namespace lamp {
namespace optim {
namespace {

// One rule for Adam and AdamW: torch::optim's, which differ only in where the
// weight decay goes (L2 term in the gradient vs decoupled decay of p).
template <typename Options, typename State>
struct Rule {
  static constexpr bool kDecoupled =
      std::is_same<Options, torch::optim::AdamWOptions>::value;
  static constexpr const char* kCaller =
      kDecoupled ? "lamp::optim::AdamW" : "lamp::optim::Adam";

  // The state of `p`, created as torch::optim creates it (step 0, zero
  // moments in p's memory format).
  static State& state_of(torch::optim::Optimizer& optimizer,
                         const torch::Tensor& p, bool amsgrad) {
    auto& state = optimizer.state();
    const auto key = lamp::detail::optimizer_state_key(p);
    auto it = state.find(key);
    if (it == state.end()) {
      internal::check_not_capturing(p, kCaller);
      auto created = std::make_unique<State>();
      created->step(0);
      created->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      created->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      if (amsgrad) {
        created->max_exp_avg_sq(
            torch::zeros_like(p, torch::MemoryFormat::Preserve));
      }
      it = state.emplace(key, std::move(created)).first;
    }
    return static_cast<State&>(*it->second);
  }

  // Writes the device step counts into the state's `step` (a host read each);
  // the device counts stay in use (a captured CUDA graph holds them).
  static void write_steps_to_host(torch::optim::Optimizer& optimizer,
                                  const detail::DeviceSteps& steps) {
    auto& state = optimizer.state();
    for (const auto& item : steps) {
      const auto it =
          state.find(lamp::detail::optimizer_state_key(item.second.first));
      if (it != state.end()) {
        static_cast<State&>(*it->second)
            .step(static_cast<int64_t>(
                item.second.second.template item<float>()));
      }
    }
  }

  // Leaving the fused path: the counts go back to the state for good.
  static void sync_steps_to_host(torch::optim::Optimizer& optimizer,
                                 detail::DeviceSteps& steps) {
    write_steps_to_host(optimizer, steps);
    steps.clear();
  }

  template <typename LrOn>
  static void fused(torch::optim::Optimizer& optimizer,
                    detail::DeviceSteps& device_steps, const LrOn& lr_on,
                    const torch::Tensor& grad_scale,
                    const torch::Tensor& found_inf) {
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      auto& group = groups[g];
      const auto& o = static_cast<const Options&>(group.options());
      for (auto& item : internal::buckets(group, kCaller)) {
        auto& params = item.second.params;
        const auto lr = lr_on(g, o.lr(), params[0].device());
        std::vector<torch::Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
            steps;
        for (const auto& p : params) {
          auto& state = state_of(optimizer, p, o.amsgrad());
          exp_avgs.push_back(state.exp_avg());
          exp_avg_sqs.push_back(state.exp_avg_sq());
          if (o.amsgrad()) {
            max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
          }
          auto& entry = device_steps[p.unsafeGetTensorImpl()];
          if (!entry.second.defined()) {
            internal::check_not_capturing(p, kCaller);
            entry = {p, torch::full({}, static_cast<float>(state.step()),
                                    p.options().dtype(torch::kFloat))};
          }
          steps.push_back(entry.second);
        }
        // As Python's fused Adam: count the step on the device, and take it
        // back where the step was skipped.
        at::_foreach_add_(steps, 1);
        lamp::detail::fused_adam_(kDecoupled, params, item.second.grads,
                                  exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
                                  o.lr(), lr, std::get<0>(o.betas()),
                                  std::get<1>(o.betas()), o.weight_decay(),
                                  o.eps(), o.amsgrad(), grad_scale, found_inf);
        if (found_inf.defined()) {
          const std::vector<torch::Tensor> flags(steps.size(), found_inf);
          at::_foreach_sub_(steps, flags);
        }
      }
    }
  }

  static void foreach (torch::optim::Optimizer& optimizer) {
    for (auto& group : optimizer.param_groups()) {
      const auto& o = static_cast<const Options&>(group.options());
      const double beta1 = std::get<0>(o.betas()),
                   beta2 = std::get<1>(o.betas());
      for (auto& item : internal::buckets(group, kCaller)) {
        auto& params = item.second.params;
        std::vector<torch::Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
        std::vector<at::Scalar> bias2_sqrt, neg_step_size;
        for (const auto& p : params) {
          auto& state = state_of(optimizer, p, o.amsgrad());
          state.step(state.step() + 1);
          const double bias1 = 1 - std::pow(beta1, state.step());
          const double bias2 = 1 - std::pow(beta2, state.step());
          bias2_sqrt.emplace_back(std::sqrt(bias2));
          neg_step_size.emplace_back(-o.lr() / bias1);
          exp_avgs.push_back(state.exp_avg());
          exp_avg_sqs.push_back(state.exp_avg_sq());
          if (o.amsgrad()) {
            max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
          }
        }
        std::vector<torch::Tensor> grads = item.second.grads;
        if (o.weight_decay() != 0) {
          if (kDecoupled) {
            at::_foreach_mul_(params, 1 - o.lr() * o.weight_decay());
          } else {
            grads = at::_foreach_add(grads, params, o.weight_decay());
          }
        }
        at::_foreach_mul_(exp_avgs, beta1);
        at::_foreach_add_(exp_avgs, grads, 1 - beta1);
        at::_foreach_mul_(exp_avg_sqs, beta2);
        at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
        if (o.amsgrad()) {
          for (size_t i = 0; i < params.size(); ++i) {
            torch::max_out(max_exp_avg_sqs[i], exp_avg_sqs[i],
                           max_exp_avg_sqs[i]);
          }
        }
        auto denom =
            at::_foreach_sqrt(o.amsgrad() ? max_exp_avg_sqs : exp_avg_sqs);
        at::_foreach_div_(denom, bias2_sqrt);
        at::_foreach_add_(denom, o.eps());
        at::_foreach_addcdiv_(params, exp_avgs, denom, neg_step_size);
      }
    }
  }
};

using AdamRule = Rule<torch::optim::AdamOptions, torch::optim::AdamParamState>;
using AdamWRule =
    Rule<torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

// One step of `Base` (torch::optim::Adam or AdamW) through `implementation`;
// `lr_on(group, lr, device)` is the group's device learning rate (or none).
template <typename R, typename Base, typename LrOn>
void run(Base& optimizer, Implementation implementation,
         detail::DeviceSteps& device_steps, const LrOn& lr_on,
         const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  internal::check_param_groups(optimizer, R::kCaller);
  if (implementation != Implementation::kFused) {
    if (!internal::prepare_scaled_step(optimizer, grad_scale, found_inf)) {
      return;
    }
    // The counts the fused path kept on the device go back to the state.
    R::sync_steps_to_host(optimizer, device_steps);
  }
  torch::NoGradGuard no_grad;
  switch (implementation) {
    case Implementation::kPerTensor:
      optimizer.Base::step();
      return;
    case Implementation::kForEach:
      R::foreach (optimizer);
      return;
    default:
      R::fused(optimizer, device_steps, lr_on, grad_scale,
               internal::skip_flag(found_inf));
  }
}

// What a captured fused step of Adam or AdamW bakes in (all but lr).
template <typename Options>
void visit_adam_options(const torch::optim::OptimizerParamGroup& group,
                        AmpStep::BakedOptionVisitor visit) {
  const auto& o = static_cast<const Options&>(group.options());
  visit({"betas[0]", std::get<0>(o.betas())});
  visit({"betas[1]", std::get<1>(o.betas())});
  visit({"eps", o.eps()});
  visit({"weight_decay", o.weight_decay()});
  visit({"amsgrad", o.amsgrad() ? 1.0 : 0.0, /*flag=*/true});
}

} // namespace

// ---------------------------------------------------------------------- Adam

Adam::Adam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
           torch::optim::AdamOptions defaults, Implementation implementation)
    : FusedOptimizer(implementation, AdamRule::kCaller,
                     std::vector<torch::optim::OptimizerParamGroup>{},
                     std::move(defaults)) {
  internal::add_param_groups_as_given(*this, std::move(param_groups),
                                      AdamRule::kCaller);
  internal::check_param_groups(*this, AdamRule::kCaller);
}

Adam::Adam(std::vector<torch::Tensor> params,
           torch::optim::AdamOptions defaults, Implementation implementation)
    : FusedOptimizer(implementation, AdamRule::kCaller,
                     unique_tensors(std::move(params)), std::move(defaults)) {
  internal::check_param_groups(*this, AdamRule::kCaller);
}

void Adam::step_scaled(const torch::Tensor& grad_scale,
                       const torch::Tensor& found_inf) {
  run<AdamRule, torch::optim::Adam>(
      *this, implementation(), device_steps_,
      [this](size_t group, double lr, const torch::Device& device) {
        return device_lr_for(group, lr, device);
      },
      grad_scale, found_inf);
}

void Adam::baked_in_options(const torch::optim::OptimizerParamGroup& group,
                            BakedOptionVisitor visit) const {
  visit_adam_options<torch::optim::AdamOptions>(group, visit);
}

void Adam::save(torch::serialize::OutputArchive& archive) const {
  AdamRule::write_steps_to_host(const_cast<Adam&>(*this), device_steps_);
  torch::optim::Adam::save(archive);
}

void Adam::load(torch::serialize::InputArchive& archive) {
  // After the load: one that throws keeps the device step counts. The state
  // replaced, so that no parameter keeps moments without their step count.
  internal::load_replacing_state(*this,
                                 [&] { torch::optim::Adam::load(archive); });
  device_steps_.clear();
  state_replaced();
}

// --------------------------------------------------------------------- AdamW

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
             torch::optim::AdamWOptions defaults, Implementation implementation)
    : FusedOptimizer(implementation, AdamWRule::kCaller,
                     std::vector<torch::optim::OptimizerParamGroup>{},
                     std::move(defaults)) {
  internal::add_param_groups_as_given(*this, std::move(param_groups),
                                      AdamWRule::kCaller);
  internal::check_param_groups(*this, AdamWRule::kCaller);
}

AdamW::AdamW(std::vector<torch::Tensor> params,
             torch::optim::AdamWOptions defaults, Implementation implementation)
    : FusedOptimizer(implementation, AdamWRule::kCaller,
                     unique_tensors(std::move(params)), std::move(defaults)) {
  internal::check_param_groups(*this, AdamWRule::kCaller);
}

void AdamW::step_scaled(const torch::Tensor& grad_scale,
                        const torch::Tensor& found_inf) {
  run<AdamWRule, torch::optim::AdamW>(
      *this, implementation(), device_steps_,
      [this](size_t group, double lr, const torch::Device& device) {
        return device_lr_for(group, lr, device);
      },
      grad_scale, found_inf);
}

void AdamW::baked_in_options(const torch::optim::OptimizerParamGroup& group,
                             BakedOptionVisitor visit) const {
  visit_adam_options<torch::optim::AdamWOptions>(group, visit);
}

void AdamW::save(torch::serialize::OutputArchive& archive) const {
  AdamWRule::write_steps_to_host(const_cast<AdamW&>(*this), device_steps_);
  torch::optim::AdamW::save(archive);
}

void AdamW::load(torch::serialize::InputArchive& archive) {
  // After the load: one that throws keeps the device step counts. The state
  // replaced, so that no parameter keeps moments without their step count.
  internal::load_replacing_state(*this,
                                 [&] { torch::optim::AdamW::load(archive); });
  device_steps_.clear();
  state_replaced();
}

} // namespace optim
} // namespace lamp
