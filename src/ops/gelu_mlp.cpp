// A transformer's MLP with its bias and GELU in the products' epilogues:
// cuBLASLt where it can run (src/ops/gelu_mlp_cuda.cpp), else the stock
// composition's ATen ops, op for op (which the CPU tests check bit for bit
// against it).
#include "lamp/ops/gelu_mlp.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <string>
#include <utility>

#include "ops/argument_checks.h"
#include "ops/epilogue_fallbacks.h"
#include "ops/gelu_mlp_cuda.h"
#include "ops/linear_bgrad_cuda.h"
#include "platform/autocast_on.h"
#include "platform/compat.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace ops {
namespace {

constexpr const char* kGeluMlpWho = "lamp::ops::gelu_mlp";

void check_arguments(const torch::Tensor& x, const torch::Tensor& fc_weight,
                     const torch::Tensor& fc_bias,
                     const torch::Tensor& proj_weight,
                     const torch::Tensor& proj_bias,
                     const GeluMlpOptions& options, const char* who) {
  TORCH_CHECK(x.defined() && fc_weight.defined() && proj_weight.defined(), who,
              ": x, fc_weight and proj_weight must be given (the biases may "
              "be undefined).");
  TORCH_CHECK(
      options.approximate() == "none" || options.approximate() == "tanh", who,
      ": approximate must be \"none\" (erf) or \"tanh\", got \"",
      options.approximate(), "\".");
  TORCH_CHECK(fc_weight.dim() == 2 && proj_weight.dim() == 2 &&
                  proj_weight.size(1) == fc_weight.size(0),
              who, ": fc_weight must be [hidden, in] and proj_weight [out, ",
              "hidden] with one hidden size, got ", fc_weight.sizes(), " and ",
              proj_weight.sizes(), ".");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == fc_weight.size(1), who,
              ": x must be [..., ", fc_weight.size(1),
              "] (fc_weight's in), got ", x.sizes(), ".");
  TORCH_CHECK(x.numel() > 0, who, ": no rows (x ", x.sizes(),
              "): give at least one row.");
  lamp::detail::check_floating_on_device(who, x,
                                         {{"x", x},
                                          {"fc_weight", fc_weight},
                                          {"fc_bias", fc_bias},
                                          {"proj_weight", proj_weight},
                                          {"proj_bias", proj_bias}});
  TORCH_CHECK(!fc_bias.defined() ||
                  (fc_bias.dim() == 1 && fc_bias.size(0) == fc_weight.size(0)),
              who, ": fc_bias must be [", fc_weight.size(0), "], got ",
              fc_bias.sizes(), ".");
  TORCH_CHECK(
      !proj_bias.defined() ||
          (proj_bias.dim() == 1 && proj_bias.size(0) == proj_weight.size(0)),
      who, ": proj_bias must be [", proj_weight.size(0), "], got ",
      proj_bias.sizes(), ".");
}

// "" where the epilogues run these arguments, else why not.
std::string epilogue_unavailable_reason(const torch::Tensor& x,
                                        const torch::Tensor& fc_weight,
                                        const torch::Tensor& proj_weight,
                                        const GeluMlpOptions& options,
                                        at::ScalarType compute) {
  if (!x.is_cuda()) {
    return std::string("the tensors are on ") + x.device().str() +
           ", cuBLASLt is CUDA's";
  }
  if (options.approximate() != "tanh") {
    return "cuBLASLt's GELU epilogue computes the tanh approximation, and "
           "this MLP's GELU is the exact one (approximate \"tanh\" fuses it)";
  }
  return lamp::detail::gelu_mlp_epilogue_unavailable_reason(
      compute, x.numel() / x.size(-1), fc_weight.size(1), fc_weight.size(0),
      proj_weight.size(0));
}

// A bias passed (`present`, of any size: an empty layer's has no element
// and still gets its empty gradient, as linear's) in `dtype`, else undefined.
torch::Tensor cast_or_undefined(const torch::Tensor& t, bool present,
                                at::ScalarType dtype) {
  return present ? t.to(dtype).contiguous() : torch::Tensor();
}

// y = x w^T (+ b) as torch::linear runs a 2-d input.
torch::Tensor product(const torch::Tensor& x, const torch::Tensor& w,
                      const torch::Tensor& b) {
  return b.defined() ? torch::addmm(b, x, w.t()) : torch::mm(x, w.t());
}

// The MLP on [rows, in], epilogues or ATen ops, and its backward. Inputs:
// x, fc_weight, fc_bias, proj_weight, proj_bias (an absent bias an empty
// placeholder, which has_fc_bias / has_proj_bias tell from a bias of an
// empty layer).
class GeluMlpFunction : public torch::autograd::Function<GeluMlpFunction> {
 public:
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
      const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
      const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
      bool has_fc_bias, bool has_proj_bias, const std::string& approximate,
      bool epilogue, bool fused_bias_grad, at::ScalarType compute) {
    const auto xc = x.to(compute).contiguous();
    const auto w1 = fc_weight.to(compute).contiguous();
    const auto b1 = cast_or_undefined(fc_bias, has_fc_bias, compute);
    const auto w2 = proj_weight.to(compute).contiguous();
    const auto b2 = cast_or_undefined(proj_bias, has_proj_bias, compute);
    torch::Tensor pre, h;
    std::string why;
    if (epilogue &&
        !lamp::detail::gelu_mlp_fc_forward(xc, w1, b1, pre, h, why)) {
      lamp::detail::note_epilogue_fallback();
      TORCH_WARN_ONCE(kGeluMlpWho,
                      ": running ATen ops instead of cuBLASLt's "
                      "epilogues: ",
                      why, ".");
      epilogue = false;
    }
    if (!epilogue) {
      pre = product(xc, w1, b1);
      h = torch::gelu(pre, approximate);
    }
    ctx->save_for_backward({xc, w1, w2, pre, h});
    ctx->saved_data["approximate"] = approximate;
    ctx->saved_data["epilogue"] = epilogue;
    ctx->saved_data["fused_bias_grad"] = fused_bias_grad;
    ctx->saved_data["has_fc_bias"] = b1.defined();
    ctx->saved_data["has_proj_bias"] = b2.defined();
    for (const auto& [key, t] :
         {std::pair<const char*, const torch::Tensor&>{"x", x},
          std::pair<const char*, const torch::Tensor&>{"fc_weight", fc_weight},
          std::pair<const char*, const torch::Tensor&>{"fc_bias", fc_bias},
          std::pair<const char*, const torch::Tensor&>{"proj_weight",
                                                       proj_weight},
          std::pair<const char*, const torch::Tensor&>{"proj_bias",
                                                       proj_bias}}) {
      ctx->saved_data[key] = static_cast<int64_t>(t.scalar_type());
    }
    return product(h, w2, b2);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    lamp::detail::refuse_higher_order_gradients(
        "lamp::ops::gelu_mlp",
        "gelu_mlp_reference (the stock composition) gives them.");
    const auto saved = ctx->get_saved_variables();
    const auto& xc = saved[0];
    const auto& w1 = saved[1];
    const auto& w2 = saved[2];
    const auto& pre = saved[3];
    const auto& h = saved[4];
    const auto approximate = ctx->saved_data["approximate"].toStringRef();
    bool epilogue = ctx->saved_data["epilogue"].toBool();
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    const bool want_fc_bias =
        ctx->saved_data["has_fc_bias"].toBool() && ctx->needs_input_grad(2);
    const bool want_proj_bias =
        ctx->saved_data["has_proj_bias"].toBool() && ctx->needs_input_grad(4);
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::autocast_dispatch_keyset);
    const auto g = grads[0].to(xc.scalar_type()).contiguous();
    torch::Tensor d_pre, d_b1;
    std::string why;
    if (epilogue && !lamp::detail::gelu_mlp_proj_backward(
                        g, w2, pre, want_fc_bias, d_pre, d_b1, why)) {
      lamp::detail::note_epilogue_fallback();
      TORCH_WARN_ONCE(kGeluMlpWho,
                      ": running ATen ops instead of cuBLASLt's "
                      "epilogues in the backward: ",
                      why, ".");
      epilogue = false;
    }
    if (!epilogue) {
      // addmm's and gelu's own backward formulas, in autograd's order.
      d_pre = torch::gelu_backward(g.mm(w2), pre, approximate);
      if (want_fc_bias) {
        d_b1 = d_pre.sum(0);
      }
    }
    torch::autograd::variable_list out(11);
    if (ctx->needs_input_grad(0)) {
      out[0] = d_pre.mm(w1).to(dtype("x"));
    }
    if (ctx->needs_input_grad(1)) {
      out[1] = d_pre.t().mm(xc).to(dtype("fc_weight"));
    }
    if (want_fc_bias) {
      out[2] = d_b1.to(dtype("fc_bias"));
    }
    torch::Tensor d_w2, d_b2;
    if (epilogue && ctx->saved_data["fused_bias_grad"].toBool() &&
        ctx->needs_input_grad(3) && want_proj_bias &&
        !lamp::detail::linear_weight_bias_grad(g, h, d_w2, d_b2, why)) {
      lamp::detail::note_epilogue_fallback();
      TORCH_WARN_ONCE(kGeluMlpWho,
                      ": summing the second bias's gradient with ATen ops "
                      "instead of cuBLASLt's epilogue: ",
                      why, ".");
    }
    if (ctx->needs_input_grad(3)) {
      out[3] = (d_w2.defined() ? d_w2 : g.t().mm(h)).to(dtype("proj_weight"));
    }
    if (want_proj_bias) {
      out[4] = (d_b2.defined() ? d_b2 : g.sum(0)).to(dtype("proj_bias"));
    }
    return out;
  }
};

} // namespace

torch::Tensor gelu_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight,
                       const torch::Tensor& fc_bias,
                       const torch::Tensor& proj_weight,
                       const torch::Tensor& proj_bias,
                       const GeluMlpOptions& options) {
  check_arguments(x, fc_weight, fc_bias, proj_weight, proj_bias, options,
                  kGeluMlpWho);
  const auto compute = lamp::detail::linear_compute_dtype(x);
  const std::string why =
      epilogue_unavailable_reason(x, fc_weight, proj_weight, options, compute);
  if (!why.empty() && x.is_cuda()) {
    lamp::detail::note_epilogue_fallback();
    TORCH_WARN_ONCE(kGeluMlpWho,
                    ": running ATen ops instead of cuBLASLt's "
                    "epilogues: ",
                    why, ".");
  }
  const int64_t in = x.size(-1);
  auto shape = x.sizes().vec();
  shape.back() = proj_weight.size(0);
  // The products in `compute` as decided: autocast must not cast them again.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  // An absent bias as an empty tensor: a custom Function's tensor arguments
  // must be defined (LibTorch 1.13).
  const auto or_empty = [&](const torch::Tensor& t) {
    return t.defined() ? t : torch::empty({0}, x.options());
  };
  return GeluMlpFunction::apply(x.reshape({-1, in}), fc_weight,
                                or_empty(fc_bias), proj_weight,
                                or_empty(proj_bias), fc_bias.defined(),
                                proj_bias.defined(), options.approximate(),
                                why.empty(), options.fused_bias_grad(), compute)
      .view(shape);
}

torch::Tensor gelu_mlp_reference(const torch::Tensor& x,
                                 const torch::Tensor& fc_weight,
                                 const torch::Tensor& fc_bias,
                                 const torch::Tensor& proj_weight,
                                 const torch::Tensor& proj_bias,
                                 const GeluMlpOptions& options) {
  check_arguments(x, fc_weight, fc_bias, proj_weight, proj_bias, options,
                  "lamp::ops::gelu_mlp_reference");
  // Without autocast, linear wants one dtype: the weights cast to x's (with
  // autocast the casts are autocast's and these are no-ops on its dtype).
  const auto dtype = x.scalar_type();
  const auto cast = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(dtype) : t;
  };
  const auto hidden = torch::linear(x, cast(fc_weight), cast(fc_bias));
  return torch::linear(torch::gelu(hidden, options.approximate()),
                       cast(proj_weight), cast(proj_bias));
}

std::string gelu_mlp_path(const torch::Tensor& x,
                          const torch::Tensor& fc_weight,
                          const torch::Tensor& proj_weight,
                          const GeluMlpOptions& options) {
  check_arguments(x, fc_weight, torch::Tensor(), proj_weight, torch::Tensor(),
                  options, "lamp::ops::gelu_mlp_path");
  const std::string why =
      epilogue_unavailable_reason(x, fc_weight, proj_weight, options,
                                  lamp::detail::linear_compute_dtype(x));
  return why.empty() ? "cuBLASLt epilogues" : "ATen ops: " + why;
}

} // namespace ops
} // namespace lamp
