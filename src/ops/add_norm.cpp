// The residual add and the norm after it, in one operation: lamp's CUDA
// kernels where they can run, else the same arithmetic as ATen ops (which
// the CPU tests check against the stock composition).
#include "lamp/ops/add_norm.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <cmath>

#include <string>
#include <vector>

#include "ops/add_norm_cuda.h"
#include "platform/autocast_on.h"
#include "platform/compat.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace ops {
namespace {

constexpr const char* kLayerNormWho = "lamp::ops::add_layer_norm";
constexpr const char* kRmsNormWho = "lamp::ops::add_rms_norm";

void check_arguments(const torch::Tensor& x, const torch::Tensor& branch,
                     const torch::Tensor& weight, const torch::Tensor& bias,
                     const AddNormOptions& options, const char* who) {
  TORCH_CHECK(x.defined() && branch.defined(), who,
              ": the residual x and the branch must both be given.");
  TORCH_CHECK(x.is_floating_point() && branch.is_floating_point(), who,
              ": x and the branch must be floating point, got ",
              x.scalar_type(), " and ", branch.scalar_type(), ".");
  TORCH_CHECK(x.sizes() == branch.sizes(), who, ": x ", x.sizes(),
              " and the branch ", branch.sizes(),
              " must have one shape (the branch is added to x).");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, who,
              ": x must be [..., width] with a positive width, got ", x.sizes(),
              ".");
  TORCH_CHECK(x.numel() > 0, who, ": no rows (x ", x.sizes(),
              "): give at least one row.");
  TORCH_CHECK(x.device() == branch.device(), who, ": x (", x.device(),
              ") and the branch (", branch.device(),
              ") must be on one device.");
  const int64_t width = x.size(-1);
  for (const auto& [name, t] :
       {std::pair<const char*, const torch::Tensor&>{"weight", weight},
        std::pair<const char*, const torch::Tensor&>{"bias", bias}}) {
    if (!t.defined()) {
      continue;
    }
    TORCH_CHECK(t.dim() == 1 && t.size(0) == width, who, ": the ", name,
                " must be [", width, "] (x's last dimension), got ", t.sizes(),
                ".");
    TORCH_CHECK(t.is_floating_point(), who, ": the ", name,
                " must be floating point, got ", t.scalar_type(), ".");
    TORCH_CHECK(t.device() == x.device(), who, ": the ", name, " (", t.device(),
                ") must be on x's device (", x.device(), ").");
  }
  TORCH_CHECK(options.eps() > 0 && std::isfinite(options.eps()), who,
              ": eps must be positive and finite, got ", options.eps(),
              " (an infinite eps makes every row its bias).");
  TORCH_CHECK(!options.output_dtype().has_value() ||
                  at::isFloatingType(*options.output_dtype()),
              who, ": output_dtype must be a floating-point type, got ",
              *options.output_dtype(),
              " (the normalised values would be truncated, without a "
              "gradient).");
}

at::ScalarType sum_dtype(const torch::Tensor& x, const torch::Tensor& branch) {
  return at::promote_types(x.scalar_type(), branch.scalar_type());
}

// The output's dtype: the option, else what the unfused norm gives under
// autocast: FP32 where a LayerNorm is on autocast's FP32 list (CUDA's) or
// runs lamp's FP32 kernel (the CPU's with LibTorch 1.13); the sum's dtype
// where mixed-dtype kernels take it as it is (the CPU's with 2.x), and
// without autocast. Autocast casts no FP64 tensor: an FP64 sum stays FP64.
at::ScalarType normed_dtype(const torch::Tensor& x, at::ScalarType sum,
                            bool rms, const AddNormOptions& options) {
  if (options.output_dtype().has_value()) {
    return *options.output_dtype();
  }
  const auto device_type = x.device().type();
  const bool fp32_policy =
      device_type != torch::kCPU || !LAMP_TORCH_CPU_MIXED_DTYPE_NORMS;
  if (!rms && fp32_policy && sum != torch::kDouble &&
      lamp::detail::autocast_on(device_type)) {
    return torch::kFloat;
  }
  return sum;
}

// "" where the kernel runs these inputs, else why not.
std::string kernel_unavailable_reason(const torch::Tensor& x,
                                      at::ScalarType sum, at::ScalarType branch,
                                      at::ScalarType normed) {
  if (!x.is_cuda()) {
    return std::string("the tensors are on ") + x.device().str() +
           ", the kernel is CUDA's";
  }
  return lamp::detail::add_norm_kernel_unavailable_reason(
      sum, branch, normed, x.numel() / x.size(-1));
}

// FP32, or FP64 for FP64 sums (which only the ATen ops take).
at::ScalarType wide_dtype(at::ScalarType sum) {
  return sum == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// An empty `t` stands for an absent weight or bias (AddNormFunction).
torch::Tensor wide_or_undefined(const torch::Tensor& t, at::ScalarType wide) {
  return t.defined() && t.numel() > 0 ? t.to(wide).contiguous()
                                      : torch::Tensor();
}

// The forward as ATen ops, in FP32 as the kernel computes it.
lamp::detail::AddNormKernelForward aten_forward(
    const torch::Tensor& x, const torch::Tensor& branch,
    const torch::Tensor& weight, const torch::Tensor& bias, double eps,
    bool rms, at::ScalarType sum, at::ScalarType normed) {
  lamp::detail::AddNormKernelForward out;
  out.sum = torch::add(x.to(sum), branch);
  const auto s = out.sum.to(wide_dtype(sum));
  // The sum about its mean, made once for the variance and the output
  // (RMSNorm: the sum itself; its saved mean is zero for the backward).
  out.mean = rms ? torch::zeros({s.size(0)}, s.options()) : s.mean(-1);
  const auto centred = rms ? s : s - out.mean.unsqueeze(1);
  out.rstd = torch::rsqrt(centred.square().mean(-1) + eps);
  auto y = centred * out.rstd.unsqueeze(1);
  if (weight.defined()) {
    y = y * weight;
  }
  if (bias.defined()) {
    y = y + bias;
  }
  out.normed = y.to(normed);
  return out;
}

// The backward as ATen ops: the formulas of src/ops/add_norm_kernels.cu.
lamp::detail::AddNormKernelBackward aten_backward(
    const torch::Tensor& grad_normed, const torch::Tensor& grad_sum,
    const torch::Tensor& sum, const torch::Tensor& mean,
    const torch::Tensor& rstd, const torch::Tensor& weight, bool rms,
    bool want_weight, bool want_bias, at::ScalarType branch_dtype) {
  const auto inv = rstd.unsqueeze(1);
  const auto wide = wide_dtype(sum.scalar_type());
  const auto xhat = (sum.to(wide) - mean.unsqueeze(1)) * inv;
  const auto dy =
      grad_normed.defined() ? grad_normed.to(wide) : torch::zeros_like(xhat);
  const auto g = weight.defined() ? dy * weight : dy;
  auto inner = g - xhat * (g * xhat).mean(-1, /*keepdim=*/true);
  if (!rms) {
    inner = inner - g.mean(-1, /*keepdim=*/true);
  }
  auto ds = inv * inner;
  if (grad_sum.defined()) {
    ds = ds + grad_sum.to(wide);
  }
  lamp::detail::AddNormKernelBackward out;
  out.x = ds.to(sum.scalar_type());
  out.branch = ds.to(branch_dtype);
  if (want_weight) {
    out.weight = (dy * xhat).sum(0);
  }
  if (want_bias) {
    out.bias = dy.sum(0);
  }
  return out;
}

// s = x + branch and y = norm(s) on [rows, width], kernel or ATen ops; the
// backward likewise. Inputs: x, branch, weight, bias (either undefined).
class AddNormFunction : public torch::autograd::Function<AddNormFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
      const torch::Tensor& branch, const torch::Tensor& weight,
      const torch::Tensor& bias, double eps, bool rms, bool kernel,
      at::ScalarType sum, at::ScalarType normed) {
    const auto w = wide_or_undefined(weight, wide_dtype(sum));
    const auto b = wide_or_undefined(bias, wide_dtype(sum));
    auto out = kernel ? lamp::detail::add_norm_kernel_forward(
                            x, branch, w, b, eps, rms, sum, normed)
                      : aten_forward(x, branch, w, b, eps, rms, sum, normed);
    ctx->save_for_backward({out.sum, out.mean, out.rstd, w});
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["branch_dtype"] =
        static_cast<int64_t>(branch.scalar_type());
    ctx->saved_data["weight_dtype"] =
        static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->saved_data["has_bias"] = b.defined();
    return {out.sum, out.normed};
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    const bool rms = ctx->saved_data["rms"].toBool();
    lamp::detail::refuse_higher_order_gradients(
        rms ? "lamp::ops::add_rms_norm" : "lamp::ops::add_layer_norm",
        rms ? "add_rms_norm_reference (the stock composition) gives them."
            : "add_layer_norm_reference (the stock composition) gives them.");
    const auto saved = ctx->get_saved_variables();
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    const bool want_weight = saved[3].defined() && ctx->needs_input_grad(2);
    const bool want_bias =
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(3);
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::autocast_dispatch_keyset);
    auto g =
        kernel ? lamp::detail::add_norm_kernel_backward(
                     grads[1], grads[0], saved[0], saved[1], saved[2], saved[3],
                     rms, want_weight, want_bias, dtype("branch_dtype"))
               : aten_backward(grads[1], grads[0], saved[0], saved[1], saved[2],
                               saved[3], rms, want_weight, want_bias,
                               dtype("branch_dtype"));
    return {g.x.to(dtype("x_dtype")),
            g.branch,
            want_weight ? g.weight.to(dtype("weight_dtype")) : torch::Tensor(),
            want_bias ? g.bias.to(dtype("bias_dtype")) : torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

AddNormResult add_norm(const torch::Tensor& x, const torch::Tensor& branch,
                       const torch::Tensor& weight, const torch::Tensor& bias,
                       bool rms, const AddNormOptions& options,
                       const char* who) {
  check_arguments(x, branch, weight, bias, options, who);
  const auto sum = sum_dtype(x, branch);
  const auto normed = normed_dtype(x, sum, rms, options);
  const std::string why =
      kernel_unavailable_reason(x, sum, branch.scalar_type(), normed);
  if (!why.empty() && x.is_cuda()) {
    TORCH_WARN_ONCE(
        who, ": running ATen ops instead of lamp's CUDA kernel: ", why, ".");
  }
  const int64_t width = x.size(-1);
  const auto shape = x.sizes().vec();
  // Everything below in the dtypes decided above: autocast must not cast
  // the FP32 arithmetic again.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  // An absent weight or bias as an empty tensor: a custom Function's
  // tensor arguments must be defined (LibTorch 1.13).
  const auto or_empty = [&](const torch::Tensor& t) {
    return t.defined() ? t : torch::empty({0}, x.options());
  };
  auto outputs = AddNormFunction::apply(
      x.reshape({-1, width}), branch.reshape({-1, width}), or_empty(weight),
      or_empty(bias), options.eps(), rms, why.empty(), sum, normed);
  return {outputs[0].view(shape), outputs[1].view(shape)};
}

} // namespace

AddNormResult add_layer_norm(const torch::Tensor& x,
                             const torch::Tensor& branch,
                             const torch::Tensor& weight,
                             const torch::Tensor& bias,
                             const AddNormOptions& options) {
  return add_norm(x, branch, weight, bias, /*rms=*/false, options,
                  kLayerNormWho);
}

AddNormResult add_rms_norm(const torch::Tensor& x, const torch::Tensor& branch,
                           const torch::Tensor& weight,
                           const AddNormOptions& options) {
  return add_norm(x, branch, weight, torch::Tensor(), /*rms=*/true, options,
                  kRmsNormWho);
}

AddNormResult add_layer_norm_reference(const torch::Tensor& x,
                                       const torch::Tensor& branch,
                                       const torch::Tensor& weight,
                                       const torch::Tensor& bias,
                                       const AddNormOptions& options) {
  check_arguments(x, branch, weight, bias, options, kLayerNormWho);
  // The norm in FP32 on a 16-bit sum, as autocast's FP32 list runs it (and
  // LibTorch 2.x's mixed-dtype CPU kernels in effect): ATen's CUDA
  // layer_norm takes no FP32 weight beside a 16-bit input.
  auto s = x + branch;
  const auto wide = wide_dtype(s.scalar_type());
  const auto y = torch::layer_norm(
      s.to(wide), {x.size(-1)}, wide_or_undefined(weight, wide),
      wide_or_undefined(bias, wide), options.eps());
  return {s, y.to(normed_dtype(x, s.scalar_type(), /*rms=*/false, options))};
}

AddNormResult add_rms_norm_reference(const torch::Tensor& x,
                                     const torch::Tensor& branch,
                                     const torch::Tensor& weight,
                                     const AddNormOptions& options) {
  check_arguments(x, branch, weight, torch::Tensor(), options, kRmsNormWho);
  // lamp::nn::rms_norm's arithmetic (ops/ stands below nn/).
  auto s = x + branch;
  const auto wide = wide_dtype(s.scalar_type());
  const auto sw = s.to(wide);
  auto y =
      sw * torch::rsqrt(sw.pow(2).mean(-1, /*keepdim=*/true) + options.eps());
  if (weight.defined()) {
    y = y * weight.to(wide);
  }
  return {s, y.to(normed_dtype(x, s.scalar_type(), /*rms=*/true, options))};
}

std::string add_norm_path(const torch::Tensor& x, const torch::Tensor& branch) {
  TORCH_CHECK(x.defined() && branch.defined(),
              "lamp::ops::add_norm_path: x and the branch must both be given.");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0,
              "lamp::ops::add_norm_path: x must be [..., width] with a "
              "positive width, got ",
              x.sizes(), ".");
  const auto sum = sum_dtype(x, branch);
  const std::string why =
      kernel_unavailable_reason(x, sum, branch.scalar_type(), sum);
  return why.empty() ? "lamp's CUDA kernel" : "ATen ops: " + why;
}

} // namespace ops
} // namespace lamp
