// BatchNorm folded into the convolutions around it: the arithmetic of the
// fused graphs in plain ATen ops (lamp/ops/conv_batch_norm.h).
#include "lamp/ops/conv_batch_norm.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/argument_checks.h"
#include "ops/channel_affine.h"
#include "ops/conv_batch_norm_cudnn.h"
#include "platform/compat.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace ops {
namespace {

// What gives the folded ops' higher-order gradients, for their refusal.
constexpr const char* kStockModulesGiveThem =
    "The stock modules give them (lamp's programs: --fused-bn on or off).";

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

// Each of `tensors` ({name, tensor}) defined and [channels]; `optional`
// ones may be undefined.
void check_channels(
    const char* who, int64_t channels,
    std::initializer_list<std::pair<const char*, const torch::Tensor*>> tensors,
    bool optional = false) {
  for (const auto& [name, t] : tensors) {
    if (optional && !t->defined()) {
      continue;
    }
    TORCH_CHECK(t->defined() && t->dim() == 1 && t->size(0) == channels, who,
                ": ", name, " must be [", channels,
                "] (one value per channel), got ",
                t->defined() ? t->sizes() : c10::IntArrayRef{}, ".");
  }
}

// A FoldedBatchNorm's tensors, [channels] each.
void check_folded(const FoldedBatchNorm& f, int64_t channels, const char* who) {
  check_channels(who, channels,
                 {{"the folded scale", &f.scale},
                  {"the folded bias", &f.bias},
                  {"the folded mean", &f.mean},
                  {"the folded inv_std", &f.inv_std}});
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

// What BatchNorm2d's forward does this call: normalise by the batch's
// statistics (training, or no running statistics kept), update the running
// ones (training with them kept) and with which momentum. Counts the batch in
// num_batches_tracked where the running statistics are updated, as
// bn->forward() does (the cumulative average's momentum reads it).
struct BatchNormStep {
  bool batch_statistics = false;
  bool update = false;
  double momentum = 0.0;
};

BatchNormStep batch_norm_step(torch::nn::BatchNorm2dImpl& impl) {
  const auto& options = impl.options;
  BatchNormStep step;
  step.batch_statistics = impl.is_training() || !options.track_running_stats();
  if (!step.batch_statistics) {
    return step;
  }
  step.momentum = options.momentum().value_or(0.0);
  step.update = impl.is_training() && options.track_running_stats();
  if (step.update && impl.num_batches_tracked.defined()) {
    torch::NoGradGuard no_grad;
    impl.num_batches_tracked += 1;
    if (!options.momentum()) {
      step.momentum = 1.0 / impl.num_batches_tracked.item<double>();
    }
  }
  return step;
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
    lamp::detail::refuse_higher_order_gradients("lamp::ops::folded_batch_norm",
                                                kStockModulesGiveThem);
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

// ---------------------------------------------------------------------------
// folded_conv(): one convolution with its prologue and statistics epilogue.

// The layers that fell back to the reference, printed once each.
std::mutex& fallback_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& fallback_lines() {
  static std::vector<std::string> lines;
  return lines;
}

// Records `line` for folded_conv_fallbacks() and prints `message` the first
// time `line` is seen.
void note_once(const std::string& line, const std::string& message) {
  std::lock_guard<std::mutex> lock(fallback_mutex());
  auto& lines = fallback_lines();
  for (const auto& seen : lines) {
    if (seen == line) {
      return;
    }
  }
  lines.push_back(line);
  std::fprintf(stderr, "lamp: %s\n", message.c_str());
}

void note_fallback(const std::string& name, const char* pass,
                   const std::string& why) {
  note_once(name + " (" + pass + "): " + why,
            name +
                ": cuDNN's fused convolution-BatchNorm graph is not used "
                "for the " +
                pass + " pass (" + why + "); this layer runs the ATen ops.");
}

// One line, the first time, that a step of layer `name` runs the ATen ops
// where lamp's kernel was wanted.
void note_kernel_fallback(const std::string& name, const char* step,
                          const std::string& why) {
  note_once(name + " (" + step + "): " + why,
            name + ": the " + step + " runs the ATen ops, not lamp's kernel (" +
                why + ").");
}

// A per-channel elementwise step of the conv level: lamp's kernel where the
// layer runs cuDNN's graphs (`kernel`) and the kernel takes the tensors,
// else the ATen ops (one line the first time a wanted kernel does not
// apply).
torch::Tensor elementwise(const lamp::detail::ChannelAffine& op,
                          const torch::Tensor& like, bool kernel,
                          const std::string& name, const char* step) {
  std::string why;
  auto out = lamp::detail::channel_affine(op, like, kernel, &why);
  if (!why.empty()) {
    note_kernel_fallback(name, step, why);
  }
  return out;
}

torch::Tensor apply_prologue(const torch::Tensor& x, const torch::Tensor& scale,
                             const torch::Tensor& bias) {
  return torch::relu(x.to(torch::kFloat) * per_channel(scale) +
                     per_channel(bias))
      .to(x.scalar_type());
}

torch::Tensor convolve(const torch::Tensor& a, const torch::Tensor& weight,
                       int64_t stride, int64_t padding) {
  return torch::conv2d(a, weight, {}, stride, padding);
}

// dgrad and wgrad of convolve(a, weight) for `grad`: ATen's own backward (on
// CUDA, cuDNN's convolution kernels).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> convolve_backward(
    const torch::Tensor& grad, const torch::Tensor& a,
    const torch::Tensor& weight, int64_t stride, int64_t padding,
    bool need_input, bool need_weight) {
  return at::convolution_backward(grad, a, weight, at::OptionalIntArrayRef{},
                                  {stride, stride}, {padding, padding}, {1, 1},
                                  false, {0, 0}, 1,
                                  {need_input, need_weight, false});
}

// An incoming gradient in the layout lamp's kernel and cuDNN's graphs take
// (`kernel`): autograd hands on whatever layout the next op made, an NCHW
// gradient from a pooled head (adaptive_avg_pool2d's backward expands to
// NCHW) or an NCHW loss, which the kernel refuses. One copy where the layout
// differs; undefined stays undefined.
torch::Tensor kernel_layout(const torch::Tensor& grad, bool kernel) {
  return kernel && grad.defined()
             ? grad.contiguous(torch::MemoryFormat::ChannelsLast)
             : grad;
}

// The sums' gradients folded into the output's: d(sum y)/dy = 1 and
// d(sum y^2)/dy = 2 y per channel: grad_y + grad_sum + (2 grad_sum_of_squares)
// y in FP32, rounded to y's dtype, in one pass on the kernel.
torch::Tensor total_output_gradient(const torch::Tensor& grad_y,
                                    const torch::Tensor& grad_sum,
                                    const torch::Tensor& grad_sum_of_squares,
                                    const torch::Tensor& y, bool kernel,
                                    const std::string& name) {
  lamp::detail::ChannelAffine op;
  op.u = grad_y; // undefined: zeros
  op.u_shift = grad_sum;
  if (grad_sum_of_squares.defined()) {
    op.v = y;
    op.v_scale = 2.0 * grad_sum_of_squares;
  }
  return elementwise(op, y, kernel, name, "output gradient");
}

// Inputs: x, weight (in x's dtype), scale, bias (FP32 [C_in]; empty
// placeholders without a prologue: autograd takes defined tensors only);
// outputs y, sum, sum of squares.
class FoldedConvFunction
    : public torch::autograd::Function<FoldedConvFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
      const torch::Tensor& weight, const torch::Tensor& scale,
      const torch::Tensor& bias, int64_t stride, int64_t padding,
      const std::string& name, bool graphs, bool prologue) {
    // In x's dtype, as documented: autocast must not cast the convolution
    // (an FP32 x would give a 16-bit y, which the backward's FP32 x and
    // weight refuse).
    c10::impl::ExcludeDispatchKeyGuard forward_casts_nothing(
        c10::autocast_dispatch_keyset);
    const auto s = prologue ? scale : torch::Tensor();
    const auto b = prologue ? bias : torch::Tensor();
    torch::Tensor y, sum, sum_of_squares;
    bool done = false;
    if (graphs) {
      std::string why;
      done = lamp::detail::cudnn_conv_genstats(x, weight, stride, padding, s, b,
                                               y, sum, sum_of_squares, why);
      if (!done) {
        note_fallback(name, "forward", why);
      }
    }
    if (!done) {
      y = convolve(prologue ? apply_prologue(x, s, b) : x, weight, stride,
                   padding);
      const auto stats = channel_statistics(y);
      sum = stats.sum;
      sum_of_squares = stats.sum_of_squares;
    }
    ctx->save_for_backward({x, weight, scale, bias, y});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["name"] = name;
    ctx->saved_data["graphs"] = graphs;
    ctx->saved_data["prologue"] = prologue;
    return {y, sum, sum_of_squares};
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    lamp::detail::refuse_higher_order_gradients("lamp::ops::folded_conv",
                                                kStockModulesGiveThem);
    // A CPU backward runs on the caller's thread, under its autocast.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& scale = saved[2];
    const auto& bias = saved[3];
    const auto& y = saved[4];
    const int64_t stride = ctx->saved_data["stride"].toInt();
    const int64_t padding = ctx->saved_data["padding"].toInt();
    const std::string name = ctx->saved_data["name"].toStringRef();
    const bool graphs = ctx->saved_data["graphs"].toBool();
    const bool prologue = ctx->saved_data["prologue"].toBool();
    const auto grad = total_output_gradient(
        kernel_layout(grad_outputs[0], graphs), grad_outputs[1],
        grad_outputs[2], y, graphs, name);
    torch::autograd::variable_list grads(9);
    if (!prologue) {
      auto back =
          convolve_backward(grad, x, weight, stride, padding, true, true);
      grads[0] = std::get<0>(back);
      grads[1] = std::get<1>(back);
      return grads;
    }
    // Through the prologue a = relu(scale x + bias): dz = dgrad masked by
    // the ReLU, d_scale = sum dz x, d_bias = sum dz, dx = scale dz.
    torch::Tensor dz, d_scale, d_bias, dw;
    if (graphs) {
      std::string why;
      if (!lamp::detail::cudnn_dgrad_drelu_dscale(grad, weight, x, stride,
                                                  padding, scale, bias, dz,
                                                  d_scale, d_bias, why)) {
        note_fallback(name, "data gradient", why);
        dz = torch::Tensor();
      }
      if (!lamp::detail::cudnn_wgrad_prologue(grad, x, weight, stride, padding,
                                              scale, bias, dw, why)) {
        note_fallback(name, "weight gradient", why);
        dw = torch::Tensor();
      }
    }
    if (!dz.defined() || !dw.defined()) {
      const auto pre =
          x.to(torch::kFloat) * per_channel(scale) + per_channel(bias);
      const auto a = torch::relu(pre).to(x.scalar_type());
      auto back = convolve_backward(grad, a, weight, stride, padding,
                                    !dz.defined(), !dw.defined());
      if (!dz.defined()) {
        const auto masked =
            std::get<0>(back).to(torch::kFloat) * (pre > 0).to(torch::kFloat);
        dz = masked.to(x.scalar_type());
        d_bias = masked.sum({0, 2, 3});
        d_scale = (masked * x.to(torch::kFloat)).sum({0, 2, 3});
      }
      if (!dw.defined()) {
        dw = std::get<1>(back);
      }
    }
    // dx = scale dz, rounded to x's dtype.
    lamp::detail::ChannelAffine input_gradient;
    input_gradient.u = dz;
    input_gradient.u_scale = scale;
    grads[0] = elementwise(input_gradient, x, graphs, name, "input gradient");
    grads[1] = dw;
    grads[2] = d_scale;
    grads[3] = d_bias;
    return grads;
  }
};

// A residual block's end: z = relu((y scale + bias) + r) with r the
// shortcut, x itself or (p r_scale + r_bias) for a projection, in FP32 and
// rounded to y's dtype: one pass on the kernel. Inputs y, scale, bias,
// shortcut, r_scale, r_bias (empty placeholders for the identity: autograd
// takes defined tensors only).
//
// The backward gates the output's gradient by z > 0, as cuDNN's fused
// BatchNorm-add-ReLU does by its output; autograd's ReLU gates by the FP32
// sum before the rounding, which differs only where that sum is positive
// and rounds to 0 in y's dtype (below 2^-25 in FP16; nowhere in FP32).
class FoldedBlockEndFunction
    : public torch::autograd::Function<FoldedBlockEndFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& y,
                               const torch::Tensor& scale,
                               const torch::Tensor& bias,
                               const torch::Tensor& shortcut,
                               const torch::Tensor& r_scale,
                               const torch::Tensor& r_bias, bool projected,
                               bool kernel, const std::string& name) {
    lamp::detail::ChannelAffine op;
    op.u = y;
    op.u_scale = scale;
    op.u_shift = bias;
    op.v = shortcut;
    if (projected) {
      op.v_scale = r_scale;
      op.v_shift = r_bias;
    }
    op.relu = true;
    auto z = elementwise(op, y, kernel, name, "block end");
    ctx->save_for_backward({y, scale, shortcut, r_scale, z});
    ctx->saved_data["projected"] = projected;
    ctx->saved_data["kernel"] = kernel;
    ctx->saved_data["name"] = name;
    return z;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    lamp::detail::refuse_higher_order_gradients(
        "lamp::ops::folded_residual_block", kStockModulesGiveThem);
    const auto saved = ctx->get_saved_variables();
    const auto& y = saved[0];
    const auto& scale = saved[1];
    const auto& shortcut = saved[2];
    const auto& r_scale = saved[3];
    const auto& z = saved[4];
    const bool projected = ctx->saved_data["projected"].toBool();
    const bool kernel = ctx->saved_data["kernel"].toBool();
    const std::string name = ctx->saved_data["name"].toStringRef();
    const auto dz = kernel_layout(grad_outputs[0], kernel);
    // g = dz where z > 0, else 0 (FP32): each input's gradient is g times
    // its scale, rounded to its dtype; the scales' and biases' are sums.
    lamp::detail::ChannelAffine gated;
    gated.u = dz;
    gated.gate = z;
    auto y_gradient = gated;
    y_gradient.u_scale = scale;
    auto shortcut_gradient = gated;
    if (projected) {
      shortcut_gradient.u_scale = r_scale;
    }
    // One per forward argument, the three flags' undefined.
    torch::autograd::variable_list grads(9);
    grads[0] = elementwise(y_gradient, y, kernel, name, "block end gradient");
    grads[3] = elementwise(shortcut_gradient, shortcut, kernel, name,
                           "block end gradient");
    std::string why;
    const auto sums = lamp::detail::gated_sums(
        dz, z, y, projected ? shortcut : torch::Tensor(), kernel, &why);
    if (!why.empty()) {
      note_kernel_fallback(name, "block end sums", why);
    }
    grads[1] = sums.ga;
    grads[2] = sums.g;
    if (projected) {
      grads[4] = sums.gb;
      grads[5] = sums.g;
    }
    return grads;
  }
};

// A Conv2d's stride and padding, checked to be what folded_conv() takes.
std::pair<int64_t, int64_t> conv_geometry(const torch::nn::Conv2d& conv,
                                          const std::string& name) {
  TORCH_CHECK(!conv.is_empty(), "lamp::ops::folded_residual_block: ", name,
              " has no convolution.");
  const auto& o = conv->options;
  const auto* padding =
      lamp::detail::variant_get_if<torch::ExpandingArray<2>>(o.padding());
  TORCH_CHECK(!o.bias() && o.groups() == 1 && (*o.dilation())[0] == 1 &&
                  (*o.dilation())[1] == 1 &&
                  (*o.stride())[0] == (*o.stride())[1] && padding != nullptr &&
                  (**padding)[0] == (**padding)[1] &&
                  lamp::detail::variant_get_if<torch::enumtype::kZeros>(
                      o.padding_mode()) != nullptr,
              "lamp::ops::folded_residual_block: ", name,
              " must be a convolution without bias, groups or dilation, with "
              "equal strides and equal zero padding (a ResNet's are).");
  return {(*o.stride())[0], (**padding)[0]};
}

void check_layer(const ConvBatchNormLayer& layer) {
  TORCH_CHECK(!layer.conv.is_empty(),
              "lamp::ops::folded_residual_block: ", layer.name,
              " has no convolution.");
  TORCH_CHECK(!layer.bn.is_empty(),
              "lamp::ops::folded_residual_block: ", layer.name,
              " has no BatchNorm.");
  TORCH_CHECK(layer.bn->options.affine(),
              "lamp::ops::folded_residual_block: ", layer.name,
              "'s BatchNorm must be affine (a ResNet's are).");
  TORCH_CHECK(
      layer.bn->options.num_features() == layer.conv->options.out_channels(),
      "lamp::ops::folded_residual_block: ", layer.name, " outputs ",
      layer.conv->options.out_channels(),
      " channels but its BatchNorm normalises ",
      layer.bn->options.num_features(), ".");
}

// One convolution and its BatchNorm's fold.
FoldedBatchNorm conv_and_fold(const torch::Tensor& in,
                              const ConvBatchNormLayer& layer,
                              const torch::Tensor& in_scale,
                              const torch::Tensor& in_bias,
                              FoldedBackend backend, torch::Tensor& output) {
  check_layer(layer);
  const auto geometry = conv_geometry(layer.conv, layer.name);
  auto c = folded_conv(in, layer.conv->weight, geometry.first, geometry.second,
                       in_scale, in_bias, layer.name, backend);
  output = c.output;
  return finalize_batch_norm(c.sum, c.sum_of_squares,
                             c.output.numel() / c.output.size(1), layer.bn);
}

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
  const char* who = "lamp::ops::finalize_batch_norm";
  TORCH_CHECK(stats.count >= 2, who,
              ": BatchNorm in training needs "
              "more than one value per channel, got ",
              stats.count, " (a batch of one 1x1 image).");
  TORCH_CHECK(stats.sum.defined() && stats.sum.dim() == 1, who,
              ": the statistics' sum must be [C] (channel_statistics()).");
  const int64_t channels = stats.sum.size(0);
  check_channels(who, channels,
                 {{"the statistics' sum_of_squares", &stats.sum_of_squares}});
  check_channels(who, channels,
                 {{"the weight", &weight},
                  {"the bias", &bias},
                  {"the running mean", &running_mean},
                  {"the running variance", &running_var}},
                 /*optional=*/true);
  TORCH_CHECK(std::isfinite(eps) && eps >= 0 && std::isfinite(momentum), who,
              ": eps (", eps, ") must be finite and >= 0, and momentum (",
              momentum, ") finite.");
  const double n = static_cast<double>(stats.count);
  const auto mean = stats.sum / n;
  // The biased variance, as BatchNorm normalises by; one pass, so a
  // rounding below 0 is clamped.
  const auto var = (stats.sum_of_squares / n - mean * mean).clamp_min(0.0);
  {
    torch::NoGradGuard no_grad;
    if (running_mean.defined()) {
      running_mean.mul_(1.0 - momentum)
          .add_(mean.to(running_mean.dtype()), momentum);
    }
    if (running_var.defined()) {
      running_var.mul_(1.0 - momentum)
          .add_((var * (n / (n - 1.0))).to(running_var.dtype()), momentum);
    }
  }
  // Differentiable in the sums, weight and bias where they require grad.
  return fold(mean, var, weight, bias, eps);
}

FoldedBatchNorm fold_running_batch_norm(const torch::Tensor& weight,
                                        const torch::Tensor& bias,
                                        const torch::Tensor& running_mean,
                                        const torch::Tensor& running_var,
                                        double eps) {
  const char* who = "lamp::ops::fold_running_batch_norm";
  TORCH_CHECK(running_mean.defined() && running_var.defined(), who,
              ": eval mode needs the running statistics.");
  TORCH_CHECK(running_mean.dim() == 1, who,
              ": the running mean must be [C], got ", running_mean.sizes(),
              ".");
  check_channels(who, running_mean.size(0),
                 {{"the running variance", &running_var}});
  check_channels(who, running_mean.size(0),
                 {{"the weight", &weight}, {"the bias", &bias}},
                 /*optional=*/true);
  TORCH_CHECK(std::isfinite(eps) && eps >= 0, who,
              ": eps must be finite and >= 0, got ", eps, ".");
  return fold(running_mean.to(torch::kFloat), running_var.to(torch::kFloat),
              weight, bias, eps);
}

torch::Tensor scale_bias_relu(const torch::Tensor& y,
                              const FoldedBatchNorm& folded) {
  check_nchw(y, "lamp::ops::scale_bias_relu");
  check_channels(
      "lamp::ops::scale_bias_relu", y.size(1),
      {{"the folded scale", &folded.scale}, {"the folded bias", &folded.bias}});
  return torch::relu(y.to(torch::kFloat) * per_channel(folded.scale) +
                     per_channel(folded.bias))
      .to(y.scalar_type());
}

torch::Tensor scale_bias_add_relu(const torch::Tensor& y,
                                  const FoldedBatchNorm& folded,
                                  const torch::Tensor& residual) {
  check_nchw(y, "lamp::ops::scale_bias_add_relu");
  check_channels(
      "lamp::ops::scale_bias_add_relu", y.size(1),
      {{"the folded scale", &folded.scale}, {"the folded bias", &folded.bias}});
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
  check_folded(folded, y.size(1), "lamp::ops::batch_norm_backward");
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
  const char* who = "lamp::ops::apply_batch_norm_backward";
  check_nchw(y, who);
  TORCH_CHECK(grad_z.defined() && grad_z.sizes() == y.sizes(), who,
              ": the gradient ",
              grad_z.defined() ? grad_z.sizes() : c10::IntArrayRef{},
              " must have the output's shape ", y.sizes(), ".");
  check_channels(who, y.size(1),
                 {{"the backward's a", &backward.a},
                  {"the backward's b", &backward.b},
                  {"the backward's c", &backward.c}});
  return (grad_z.to(torch::kFloat) * per_channel(backward.a) +
          y.to(torch::kFloat) * per_channel(backward.b) +
          per_channel(backward.c))
      .to(y.scalar_type());
}

torch::Tensor folded_batch_norm(const torch::Tensor& y,
                                const torch::nn::BatchNorm2d& bn) {
  check_nchw(y, "lamp::ops::folded_batch_norm");
  TORCH_CHECK(!bn.is_empty(),
              "lamp::ops::folded_batch_norm: the BatchNorm2d is empty "
              "(nullptr).");
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
  const auto step = batch_norm_step(impl);
  const bool batch_statistics = step.batch_statistics;
  FoldedBatchNorm folded;
  if (batch_statistics) {
    // The statistics are constants of the op; its backward accounts for
    // them (batch_norm_backward()).
    torch::NoGradGuard no_grad;
    folded = finalize_batch_norm(
        channel_statistics(y.detach()), impl.weight.detach(),
        impl.bias.detach(), step.update ? impl.running_mean : torch::Tensor(),
        step.update ? impl.running_var : torch::Tensor(), step.momentum,
        options.eps());
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

FoldedConv folded_conv(const torch::Tensor& x, const torch::Tensor& weight,
                       int64_t stride, int64_t padding,
                       const torch::Tensor& in_scale,
                       const torch::Tensor& in_bias, const std::string& name,
                       FoldedBackend backend) {
  check_nchw(x, "lamp::ops::folded_conv");
  TORCH_CHECK(
      weight.defined() && weight.dim() == 4 && weight.size(1) == x.size(1),
      "lamp::ops::folded_conv: ", name, ": the weight must be [C_out, ",
      x.size(1), ", kH, kW] for an input of ", x.size(1), " channels, got ",
      weight.defined() ? weight.sizes() : c10::IntArrayRef{}, ".");
  TORCH_CHECK(stride >= 1 && padding >= 0, "lamp::ops::folded_conv: ", name,
              ": stride must be at least 1 and padding at least 0, got ",
              stride, " and ", padding, ".");
  // A tensor on another device would reach cuDNN's graphs as a pointer they
  // cannot read.
  const std::string who = "lamp::ops::folded_conv: " + name;
  lamp::detail::check_floating_on_device(who.c_str(), x,
                                         {{"the weight", weight},
                                          {"the prologue's scale", in_scale},
                                          {"the prologue's bias", in_bias}});
  TORCH_CHECK(in_scale.defined() == in_bias.defined(),
              "lamp::ops::folded_conv: ", name,
              ": the prologue needs both a scale and a bias, or neither.");
  const bool prologue = in_scale.defined();
  // Autograd's inputs must be defined: empty placeholders without a
  // prologue.
  auto scale = torch::empty({0}, x.options().dtype(torch::kFloat));
  auto bias = scale;
  if (prologue) {
    TORCH_CHECK(in_scale.numel() == x.size(1) && in_bias.numel() == x.size(1),
                "lamp::ops::folded_conv: ", name,
                ": the prologue's scale "
                "and bias must hold one value per input channel (",
                x.size(1), "), got ", in_scale.numel(), " and ",
                in_bias.numel(), ".");
    scale = in_scale.to(torch::kFloat).reshape({-1});
    bias = in_bias.to(torch::kFloat).reshape({-1});
  }
  const bool graphs =
      backend == FoldedBackend::kAuto && folded_conv_fallback_reason(x).empty();
  // The weight in the activations' dtype (autocast's cast, differentiable
  // back to an FP32 master), and in their layout for cuDNN's NHWC graphs.
  auto w = weight.to(x.scalar_type());
  if (graphs) {
    w = w.contiguous(torch::MemoryFormat::ChannelsLast);
  }
  auto outputs = FoldedConvFunction::apply(x, w, scale, bias, stride, padding,
                                           name, graphs, prologue);
  FoldedConv result;
  result.output = outputs[0];
  result.sum = outputs[1];
  result.sum_of_squares = outputs[2];
  return result;
}

FoldedBatchNorm finalize_batch_norm(const torch::Tensor& sum,
                                    const torch::Tensor& sum_of_squares,
                                    int64_t count,
                                    const torch::nn::BatchNorm2d& bn) {
  TORCH_CHECK(!bn.is_empty(),
              "lamp::ops::finalize_batch_norm: the BatchNorm2d is empty "
              "(nullptr).");
  auto& impl = *bn.ptr();
  const auto& options = impl.options;
  TORCH_CHECK(options.affine(),
              "lamp::ops::finalize_batch_norm: the BatchNorm must be affine "
              "(ResNet's are).");
  TORCH_CHECK(sum.defined() && sum_of_squares.defined() &&
                  sum.numel() == options.num_features() &&
                  sum_of_squares.numel() == options.num_features(),
              "lamp::ops::finalize_batch_norm: the sums must hold one value "
              "per channel (",
              options.num_features(), ").");
  const auto step = batch_norm_step(impl);
  if (!step.batch_statistics) {
    return fold_running_batch_norm(impl.weight, impl.bias, impl.running_mean,
                                   impl.running_var, options.eps());
  }
  // Differentiable in the sums and in weight and bias: autograd carries
  // BatchNorm's backward through the statistics.
  ChannelStatistics stats;
  stats.sum = sum.to(torch::kFloat);
  stats.sum_of_squares = sum_of_squares.to(torch::kFloat);
  stats.count = count;
  return finalize_batch_norm(stats, impl.weight, impl.bias,
                             step.update ? impl.running_mean : torch::Tensor(),
                             step.update ? impl.running_var : torch::Tensor(),
                             step.momentum, options.eps());
}

torch::Tensor folded_residual_block(
    const torch::Tensor& x, const std::vector<ConvBatchNormLayer>& chain,
    const ConvBatchNormLayer* shortcut, FoldedBackend backend) {
  check_nchw(x, "lamp::ops::folded_residual_block");
  TORCH_CHECK(!chain.empty(),
              "lamp::ops::folded_residual_block: the block "
              "needs at least one convolution.");
  torch::Tensor in = x, scale, bias, output;
  for (const auto& layer : chain) {
    const auto folded = conv_and_fold(in, layer, scale, bias, backend, output);
    in = output;
    scale = folded.scale;
    bias = folded.bias;
  }
  torch::Tensor residual = x;
  // Autograd's inputs must be defined: placeholders for the identity.
  torch::Tensor r_scale = torch::empty({0}, x.options().dtype(torch::kFloat));
  torch::Tensor r_bias = r_scale;
  if (shortcut != nullptr) {
    const auto folded = conv_and_fold(x, *shortcut, torch::Tensor(),
                                      torch::Tensor(), backend, residual);
    r_scale = folded.scale;
    r_bias = folded.bias;
  }
  TORCH_CHECK(residual.sizes() == in.sizes(),
              "lamp::ops::folded_residual_block: the block's output ",
              in.sizes(), " and its shortcut's ", residual.sizes(),
              " differ; a block that changes the shape needs a projection "
              "shortcut.");
  // The block's end in one pass on the GPU's fused path: the last
  // BatchNorm, the shortcut's and the ReLU.
  const bool kernel =
      backend == FoldedBackend::kAuto && folded_conv_fallback_reason(x).empty();
  const std::string name =
      chain.back().name.empty() ? "block" : chain.back().name;
  return FoldedBlockEndFunction::apply(in, scale, bias, residual, r_scale,
                                       r_bias, shortcut != nullptr, kernel,
                                       name);
}

std::string folded_conv_fallback_reason(const torch::Tensor& x) {
  auto why = lamp::detail::cudnn_graph_unavailable_reason();
  if (!why.empty()) {
    return why;
  }
  if (!x.is_cuda()) {
    return "the activations are on the " + x.device().str() +
           ": cuDNN's graphs run on CUDA.";
  }
  if (x.scalar_type() != torch::kHalf && x.scalar_type() != torch::kBFloat16) {
    return std::string("the activations are ") +
           c10::toString(x.scalar_type()) +
           ": the fused graphs take half or bfloat16 (train in amp, or "
           "convert the model with lamp::network_to_half).";
  }
  if (!x.is_contiguous(torch::MemoryFormat::ChannelsLast)) {
    return "the activations are not channels_last: the fused graphs take "
           "NHWC (--channels-last in the programs; "
           "lamp::models::to_channels_last(model) and channels_last inputs "
           "in your own).";
  }
  return "";
}

bool conv_batch_norm_fusion_built(std::string* why) {
  auto reason = lamp::detail::cudnn_graph_unavailable_reason();
  if (why != nullptr) {
    *why = reason;
  }
  return reason.empty();
}

std::vector<std::string> folded_conv_fallbacks() {
  std::lock_guard<std::mutex> lock(fallback_mutex());
  return fallback_lines();
}

} // namespace ops
} // namespace lamp
