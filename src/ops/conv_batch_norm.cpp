// BatchNorm folded into the convolutions around it: the arithmetic of the
// fused graphs in plain ATen ops (lamp/ops/conv_batch_norm.h).
#include "lamp/ops/conv_batch_norm.h"

#include <torch/torch.h>

#include <utility>

namespace lamp {
namespace ops {
namespace {

// [C] -> [1, C, 1, 1], to broadcast over an NCHW tensor.
torch::Tensor per_channel(const torch::Tensor& values) {
  return values.view({1, -1, 1, 1});
}

void check_nchw(const torch::Tensor& y, const char* who) {
  TORCH_CHECK(y.defined() && y.dim() == 4 && y.is_floating_point(), who,
              ": a convolution's output [N, C, H, W] of a floating type "
              "expected, got ",
              y.defined() ? y.sizes() : c10::IntArrayRef{}, ".");
  TORCH_CHECK(y.numel() > 0, who, ": the output ", y.sizes(), " is empty.");
}

// The affine of an affine-less BatchNorm: weight 1, bias 0.
torch::Tensor or_ones(const torch::Tensor& t, const torch::Tensor& like) {
  return t.defined() ? t.to(torch::kFloat) : torch::ones_like(like);
}
torch::Tensor or_zeros(const torch::Tensor& t, const torch::Tensor& like) {
  return t.defined() ? t.to(torch::kFloat) : torch::zeros_like(like);
}

FoldedBatchNorm fold(const torch::Tensor& mean, const torch::Tensor& var,
                     const torch::Tensor& weight, const torch::Tensor& bias,
                     double eps) {
  FoldedBatchNorm f;
  f.mean = mean;
  f.inv_std = (var + eps).rsqrt();
  f.scale = or_ones(weight, mean) * f.inv_std;
  f.bias = or_zeros(bias, mean) - mean * f.scale;
  return f;
}

// BatchNorm as one differentiable op on the folded arithmetic: forward by
// the statistics and the fold, backward by batch_norm_backward(). Inputs:
// y, weight, bias (FP32 [C]; the weight and bias enter through the fold,
// which the caller computes, updating the running statistics, and hands
// over as constants).
class FoldedBatchNormFunction
    : public torch::autograd::Function<FoldedBatchNormFunction> {
 public:
  static torch::Tensor forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& y,
      const torch::Tensor& /*weight*/, const torch::Tensor& /*bias*/,
      const torch::Tensor& scale, const torch::Tensor& shift,
      const torch::Tensor& mean, const torch::Tensor& inv_std,
      bool batch_statistics) {
    ctx->save_for_backward({y, scale, shift, mean, inv_std});
    ctx->saved_data["batch_statistics"] = batch_statistics;
    return (y.to(torch::kFloat) * per_channel(scale) + per_channel(shift))
        .to(y.scalar_type());
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    FoldedBatchNorm folded;
    folded.scale = saved[1];
    folded.bias = saved[2];
    folded.mean = saved[3];
    folded.inv_std = saved[4];
    const auto& y = saved[0];
    const auto& grad = grad_outputs[0];
    torch::autograd::variable_list grads(8);
    torch::Tensor grad_weight, grad_bias;
    if (ctx->saved_data["batch_statistics"].toBool()) {
      const auto back = batch_norm_backward(y, grad, folded);
      grads[0] = apply_batch_norm_backward(y, grad, back);
      grad_weight = back.grad_weight;
      grad_bias = back.grad_bias;
    } else {
      // Fixed statistics: an affine map of y alone.
      const auto g = grad.to(torch::kFloat);
      grads[0] = (g * per_channel(folded.scale)).to(y.scalar_type());
      grad_bias = g.sum({0, 2, 3});
      grad_weight = (g * (y.to(torch::kFloat) - per_channel(folded.mean)))
                        .sum({0, 2, 3}) *
                    folded.inv_std;
    }
    grads[1] = grad_weight;
    grads[2] = grad_bias;
    return grads;
  }
};

} // namespace

ChannelStatistics channel_statistics(const torch::Tensor& output) {
  check_nchw(output, "lamp::ops::channel_statistics");
  const auto y = output.to(torch::kFloat);
  ChannelStatistics stats;
  stats.sum = y.sum({0, 2, 3});
  stats.sum_of_squares = (y * y).sum({0, 2, 3});
  stats.count = output.numel() / output.size(1);
  return stats;
}

FoldedBatchNorm finalize_batch_norm(const ChannelStatistics& stats,
                                    const torch::Tensor& weight,
                                    const torch::Tensor& bias,
                                    const torch::Tensor& running_mean,
                                    const torch::Tensor& running_var,
                                    double momentum, double eps) {
  TORCH_CHECK(stats.count >= 2,
              "lamp::ops::finalize_batch_norm: BatchNorm in training needs "
              "more than one value per channel, got ",
              stats.count, " (a batch of one 1x1 image).");
  const double n = static_cast<double>(stats.count);
  const auto mean = stats.sum / n;
  // The biased variance, as BatchNorm normalises by; one pass, so a
  // rounding below 0 is clamped.
  const auto var = (stats.sum_of_squares / n - mean * mean).clamp_min(0.0);
  torch::NoGradGuard no_grad;
  if (running_mean.defined()) {
    running_mean.mul_(1.0 - momentum)
        .add_(mean.to(running_mean.dtype()), momentum);
  }
  if (running_var.defined()) {
    running_var.mul_(1.0 - momentum)
        .add_((var * (n / (n - 1.0))).to(running_var.dtype()), momentum);
  }
  return fold(mean, var, weight, bias, eps);
}

FoldedBatchNorm fold_running_batch_norm(const torch::Tensor& weight,
                                        const torch::Tensor& bias,
                                        const torch::Tensor& running_mean,
                                        const torch::Tensor& running_var,
                                        double eps) {
  TORCH_CHECK(running_mean.defined() && running_var.defined(),
              "lamp::ops::fold_running_batch_norm: eval mode needs the "
              "running statistics.");
  return fold(running_mean.to(torch::kFloat), running_var.to(torch::kFloat),
              weight, bias, eps);
}

torch::Tensor scale_bias_relu(const torch::Tensor& y,
                              const FoldedBatchNorm& folded) {
  check_nchw(y, "lamp::ops::scale_bias_relu");
  return torch::relu(y.to(torch::kFloat) * per_channel(folded.scale) +
                     per_channel(folded.bias))
      .to(y.scalar_type());
}

torch::Tensor scale_bias_add_relu(const torch::Tensor& y,
                                  const FoldedBatchNorm& folded,
                                  const torch::Tensor& residual) {
  check_nchw(y, "lamp::ops::scale_bias_add_relu");
  TORCH_CHECK(residual.defined() && residual.sizes() == y.sizes(),
              "lamp::ops::scale_bias_add_relu: the residual must have the "
              "output's shape ",
              y.sizes(), ", got ",
              residual.defined() ? residual.sizes() : c10::IntArrayRef{}, ".");
  return torch::relu(y.to(torch::kFloat) * per_channel(folded.scale) +
                     per_channel(folded.bias) + residual.to(torch::kFloat))
      .to(y.scalar_type());
}

BatchNormBackward batch_norm_backward(const torch::Tensor& y,
                                      const torch::Tensor& grad_z,
                                      const FoldedBatchNorm& folded) {
  check_nchw(y, "lamp::ops::batch_norm_backward");
  TORCH_CHECK(grad_z.sizes() == y.sizes(),
              "lamp::ops::batch_norm_backward: the gradient ", grad_z.sizes(),
              " must have the output's shape ", y.sizes(), ".");
  const auto yf = y.to(torch::kFloat);
  const auto g = grad_z.to(torch::kFloat);
  const double m = static_cast<double>(y.numel() / y.size(1));
  BatchNormBackward back;
  back.grad_bias = g.sum({0, 2, 3});
  back.grad_weight =
      folded.inv_std * ((g * yf).sum({0, 2, 3}) - folded.mean * back.grad_bias);
  back.a = folded.scale;
  back.b = -folded.scale * folded.inv_std * back.grad_weight / m;
  back.c = -folded.scale * back.grad_bias / m - back.b * folded.mean;
  return back;
}

torch::Tensor apply_batch_norm_backward(const torch::Tensor& y,
                                        const torch::Tensor& grad_z,
                                        const BatchNormBackward& backward) {
  return (grad_z.to(torch::kFloat) * per_channel(backward.a) +
          y.to(torch::kFloat) * per_channel(backward.b) +
          per_channel(backward.c))
      .to(y.scalar_type());
}

torch::Tensor folded_batch_norm(const torch::Tensor& y,
                                const torch::nn::BatchNorm2d& bn) {
  check_nchw(y, "lamp::ops::folded_batch_norm");
  auto& impl = *bn.ptr();
  const auto& options = impl.options;
  TORCH_CHECK(y.size(1) == options.num_features(),
              "lamp::ops::folded_batch_norm: the output has ", y.size(1),
              " channels but the BatchNorm normalises ", options.num_features(),
              ".");
  // Autograd's inputs must be defined: the affine-less BatchNorm has no
  // tensors to pass (the functional steps take it).
  TORCH_CHECK(options.affine(),
              "lamp::ops::folded_batch_norm: the BatchNorm must be affine "
              "(ResNet's are); for one without weight and bias use "
              "finalize_batch_norm() and scale_bias_relu().");
  const bool batch_statistics =
      impl.is_training() || !options.track_running_stats();
  FoldedBatchNorm folded;
  if (batch_statistics) {
    double momentum = options.momentum().value_or(0.0);
    const bool update = impl.is_training() && options.track_running_stats();
    if (update && impl.num_batches_tracked.defined()) {
      torch::NoGradGuard no_grad;
      impl.num_batches_tracked += 1;
      if (!options.momentum()) {
        momentum = 1.0 / impl.num_batches_tracked.item<double>();
      }
    }
    {
      // The statistics are constants of the op; its backward accounts for
      // them (batch_norm_backward()).
      torch::NoGradGuard no_grad;
      folded = finalize_batch_norm(
          channel_statistics(y.detach()), impl.weight.detach(),
          impl.bias.detach(), update ? impl.running_mean : torch::Tensor(),
          update ? impl.running_var : torch::Tensor(), momentum, options.eps());
    }
  } else {
    torch::NoGradGuard no_grad;
    folded = fold_running_batch_norm(impl.weight.detach(), impl.bias.detach(),
                                     impl.running_mean, impl.running_var,
                                     options.eps());
  }
  return FoldedBatchNormFunction::apply(y, impl.weight, impl.bias, folded.scale,
                                        folded.bias, folded.mean,
                                        folded.inv_std, batch_statistics);
}

torch::Tensor folded_batch_norm_relu(const torch::Tensor& y,
                                     const torch::nn::BatchNorm2d& bn) {
  // The ReLU in FP32, as the fused prologue computes it (and as LibTorch
  // 1.13's CPU, which has no FP16 ReLU, can).
  return torch::relu(folded_batch_norm(y, bn).to(torch::kFloat))
      .to(y.scalar_type());
}

torch::Tensor folded_batch_norm_add_relu(const torch::Tensor& y,
                                         const torch::Tensor& residual,
                                         const torch::nn::BatchNorm2d& bn) {
  TORCH_CHECK(residual.defined() && residual.sizes() == y.sizes(),
              "lamp::ops::folded_batch_norm_add_relu: the residual must have "
              "the output's shape ",
              y.sizes(), ", got ",
              residual.defined() ? residual.sizes() : c10::IntArrayRef{}, ".");
  return torch::relu(folded_batch_norm(y, bn).to(torch::kFloat) +
                     residual.to(torch::kFloat))
      .to(y.scalar_type());
}

} // namespace ops
} // namespace lamp
