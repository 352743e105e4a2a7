// A linear layer with the bias gradient in the weight-gradient product's
// epilogue: cuBLASLt where it can run (src/ops/linear_bgrad_cuda.cpp), else
// torch::linear's backward formulas as ATen ops, op for op (which the CPU
// tests check bit for bit against torch::linear).
#include "lamp/ops/linear_bgrad.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <string>
#include <utility>

#include "ops/argument_checks.h"
#include "ops/epilogue_fallbacks.h"
#include "ops/linear_bgrad_cuda.h"
#include "platform/autocast_on.h"
#include "platform/compat.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace ops {
namespace {

constexpr const char* kLinearBgradWho = "lamp::ops::linear_bgrad";

void check_arguments(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias, const char* who) {
  TORCH_CHECK(x.defined() && weight.defined(), who,
              ": x and weight must be given (the bias may be undefined).");
  TORCH_CHECK(weight.dim() == 2, who, ": weight must be [out, in], got ",
              weight.sizes(), ".");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), who,
              ": x must be [..., ", weight.size(1), "] (weight's in), got ",
              x.sizes(), ".");
  TORCH_CHECK(x.numel() > 0, who, ": no rows (x ", x.sizes(),
              "): give at least one row.");
  TORCH_CHECK(
      !bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
      who, ": bias must be [", weight.size(0), "], got ", bias.sizes(), ".");
  lamp::detail::check_floating_on_device(
      who, x, {{"x", x}, {"weight", weight}, {"bias", bias}});
}

// "" where the epilogue runs these arguments, else why not.
std::string epilogue_unavailable_reason(const torch::Tensor& x,
                                        const torch::Tensor& weight,
                                        const torch::Tensor& bias,
                                        at::ScalarType compute) {
  if (!bias.defined()) {
    return "no bias, no bias gradient to fuse";
  }
  if (!x.is_cuda()) {
    return std::string("the tensors are on ") + x.device().str() +
           ", cuBLASLt is CUDA's";
  }
  return lamp::detail::linear_bgrad_unavailable_reason(
      compute, x.numel() / x.size(-1), weight.size(1), weight.size(0));
}

// y = x w^T + b on [rows, in] as torch::linear runs a 2-d input (addmm),
// and its backward: addmm's formulas, with the bias gradient from the
// weight-gradient product's epilogue where `epilogue`. Inputs: x, weight,
// bias.
class LinearBgradFunction
    : public torch::autograd::Function<LinearBgradFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& x,
                               const torch::Tensor& weight,
                               const torch::Tensor& bias, bool epilogue,
                               at::ScalarType compute) {
    const auto xc = x.to(compute).contiguous();
    const auto w = weight.to(compute).contiguous();
    const auto b = bias.to(compute);
    ctx->save_for_backward({xc, w});
    ctx->saved_data["epilogue"] = epilogue;
    for (const auto& [key, t] :
         {std::pair<const char*, const torch::Tensor&>{"x", x},
          std::pair<const char*, const torch::Tensor&>{"weight", weight},
          std::pair<const char*, const torch::Tensor&>{"bias", bias}}) {
      ctx->saved_data[key] = static_cast<int64_t>(t.scalar_type());
    }
    return torch::addmm(b, xc, w.t());
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    lamp::detail::refuse_higher_order_gradients("lamp::ops::linear_bgrad",
                                                "torch::linear gives them.");
    const auto saved = ctx->get_saved_variables();
    const auto& xc = saved[0];
    const auto& w = saved[1];
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::autocast_dispatch_keyset);
    const auto g = grads[0].to(xc.scalar_type()).contiguous();
    torch::autograd::variable_list out(5);
    if (ctx->needs_input_grad(0)) {
      out[0] = g.mm(w).to(dtype("x"));
    }
    const bool want_weight = ctx->needs_input_grad(1);
    const bool want_bias = ctx->needs_input_grad(2);
    torch::Tensor d_weight, d_bias;
    std::string why;
    if (want_weight && want_bias && ctx->saved_data["epilogue"].toBool() &&
        !lamp::detail::linear_weight_bias_grad(g, xc, d_weight, d_bias, why)) {
      lamp::detail::note_epilogue_fallback();
      TORCH_WARN_ONCE(kLinearBgradWho,
                      ": running ATen ops instead of cuBLASLt's epilogue "
                      "in the backward: ",
                      why, ".");
    }
    if (want_weight && !d_weight.defined()) {
      // addmm's own formula for its second factor, w^T, read column-major.
      d_weight = g.t().mm(xc);
    }
    if (want_bias && !d_bias.defined()) {
      d_bias = g.sum(0);
    }
    if (want_weight) {
      out[1] = d_weight.to(dtype("weight"));
    }
    if (want_bias) {
      out[2] = d_bias.to(dtype("bias"));
    }
    return out;
  }
};

} // namespace

torch::Tensor linear_bgrad(const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias) {
  check_arguments(x, weight, bias, kLinearBgradWho);
  if (!bias.defined()) {
    // Nothing to fuse: torch::linear, autocast's casts, or the weight cast
    // to x's dtype outside autocast as the fused path would.
    return torch::linear(x, lamp::detail::autocast_on(x.device().type())
                                ? weight
                                : weight.to(x.scalar_type()));
  }
  const auto compute = lamp::detail::linear_compute_dtype(x);
  const std::string why = epilogue_unavailable_reason(x, weight, bias, compute);
  if (!why.empty() && x.is_cuda()) {
    lamp::detail::note_epilogue_fallback();
    TORCH_WARN_ONCE(kLinearBgradWho,
                    ": running ATen ops instead of cuBLASLt's epilogue: ", why,
                    ".");
  }
  const int64_t in = x.size(-1);
  auto shape = x.sizes().vec();
  shape.back() = weight.size(0);
  // The product in `compute` as decided: autocast must not cast it again.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return LinearBgradFunction::apply(x.reshape({-1, in}), weight, bias,
                                    why.empty(), compute)
      .view(shape);
}

std::string linear_bgrad_path(const torch::Tensor& x,
                              const torch::Tensor& weight,
                              const torch::Tensor& bias) {
  check_arguments(x, weight, bias, "lamp::ops::linear_bgrad_path");
  const std::string why = epilogue_unavailable_reason(
      x, weight, bias, lamp::detail::linear_compute_dtype(x));
  return why.empty() ? "cuBLASLt epilogue" : "ATen ops: " + why;
}

} // namespace ops
} // namespace lamp
