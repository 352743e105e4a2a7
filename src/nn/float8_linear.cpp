// The FP8 Linear: its autograd function (the three FP8 products) and
// float8_linear().
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lamp/nn/linear.h"
#include "nn/float8_internal.h"
#include "platform/compat.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace nn {

using namespace internal;

#if LAMP_TORCH_FLOAT8
namespace {

int64_t round_up_16(int64_t n) {
  return (n + 15) / 16 * 16;
}

constexpr auto kE4M3 = c10::ScalarType::Float8_e4m3fn;
constexpr auto kE5M2 = c10::ScalarType::Float8_e5m2;

torch::Tensor pad_rows(const torch::Tensor& t2d, int64_t rows) {
  if (t2d.size(0) == rows) {
    return t2d;
  }
  return torch::constant_pad_nd(t2d, {0, 0, 0, rows - t2d.size(0)}, 0.0);
}

// An FP8 product's operand and the factor that undoes its scale.
struct Operand {
  torch::Tensor data;
  torch::Tensor inverse_scale;
};

// a (row-major) x b (column-major) in FP8, after CUDA's rules.
torch::Tensor scaled_mm(const Operand& a, const Operand& b,
                        torch::Dtype out_dtype, const torch::Tensor& bias,
                        bool fast_accum, const std::string& layer,
                        const std::string& product) {
  detail::check_scaled_mm_operands(a.data, b.data, layer, product);
  c10::optional<torch::Tensor> bias_arg;
  if (bias.defined()) {
    bias_arg = bias;
  }
  return at::_scaled_mm(a.data, b.data, a.inverse_scale, b.inverse_scale,
                        bias_arg, c10::nullopt, out_dtype, fast_accum);
}

class Float8LinearFunction
    : public torch::autograd::Function<Float8LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& input,
                               const torch::Tensor& weight,
                               const torch::Tensor& bias,
                               Float8StateImpl* state, torch::Dtype out_dtype,
                               bool grad_input, bool grad_weight) {
    const bool delayed = state->recipe().scaling() == Float8Scaling::kDelayed;
    const int64_t margin = state->recipe().margin();
    const bool fused = state->recipe().fused_casts();
    const int64_t k = weight.size(1), n = weight.size(0);
    const int64_t m = input.numel() / k;
    const auto x2d = pad_rows(input.reshape({m, k}), round_up_16(m));
    // The backward's products take X and W transposed (dW = dY^T X with X
    // column-major, dX = dY W with W column-major): each cast writes its
    // transpose as it goes (one pass on lamp's kernel), and only the
    // transposes are kept, only for the gradients asked for.
    const auto x = cast_operand(x2d, operand_state(*state, 0), delayed, margin,
                                kE4M3, fused, /*transpose=*/grad_weight);
    const auto w = cast_operand(weight, operand_state(*state, 1), delayed,
                                margin, kE4M3, fused, /*transpose=*/grad_input);
    // No bias: an empty tensor (autograd's inputs must be defined).
    const bool has_bias = bias.numel() > 0;
    // CUDA takes a bias with a 16-bit output only; an FP32 one is added
    // after.
    const bool fused_bias = has_bias && is_low_precision(out_dtype);
    auto y =
        scaled_mm({x.data, x.inverse_scale}, {w.data.t(), w.inverse_scale},
                  out_dtype, fused_bias ? bias.to(out_dtype) : torch::Tensor(),
                  /*fast_accum=*/true, state->name(), "Y = X W^T");
    if (has_bias && !fused_bias) {
      y = y + bias.to(out_dtype);
    }
    ctx->save_for_backward(
        {x.transposed, x.inverse_scale, w.transposed, w.inverse_scale});
    const auto g = operand_state(*state, 2);
    ctx->saved_data["g_scale"] = g.scale;
    ctx->saved_data["g_pending"] = g.pending_amax;
    ctx->saved_data["g_saturated"] = g.saturated;
    ctx->saved_data["g_non_finite"] = g.non_finite;
    ctx->saved_data["g_last_scale"] = g.last_scale;
    ctx->saved_data["g_casts"] = g.casts;
    ctx->saved_data["delayed"] = delayed;
    ctx->saved_data["margin"] = margin;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["m"] = m;
    ctx->saved_data["n"] = n;
    ctx->saved_data["k"] = k;
    ctx->saved_data["padded_m"] = x2d.size(0);
    ctx->saved_data["name"] = state->name();
    ctx->saved_data["input_dtype"] = input.scalar_type();
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["bias_dtype"] = bias.scalar_type();
    std::vector<int64_t> out_shape(input.sizes().begin(), input.sizes().end());
    out_shape.back() = n;
    return y.narrow(0, 0, m).view(out_shape);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    lamp::detail::refuse_higher_order_gradients(
        "An FP8 Linear (lamp::nn::float8_linear)",
        "Leave the layer out of convert_to_float8() where you need them.");
    const auto saved = ctx->get_saved_variables();
    // data^T of X [padded m, k] and of W [n, k], where they were kept.
    const auto& x_t = saved[0];
    const auto& w_t = saved[2];
    const auto& d = ctx->saved_data;
    const OperandState g{
        d.at("g_scale").toTensor(),      d.at("g_pending").toTensor(),
        d.at("g_saturated").toTensor(),  d.at("g_non_finite").toTensor(),
        d.at("g_last_scale").toTensor(), d.at("g_casts").toTensor()};
    const bool delayed = d.at("delayed").toBool();
    const int64_t margin = d.at("margin").toInt();
    const int64_t m = d.at("m").toInt();
    const auto name = d.at("name").toStringRef();
    const auto input_dtype = d.at("input_dtype").toScalarType();
    const auto weight_dtype = d.at("weight_dtype").toScalarType();
    const int64_t n = d.at("n").toInt(), k = d.at("k").toInt();
    const auto& grad = grad_outputs[0];
    const auto dy2d = pad_rows(grad.reshape({m, n}), d.at("padded_m").toInt());
    const auto dy =
        cast_operand(dy2d, g, delayed, margin, kE5M2, d.at("fused").toBool(),
                     /*transpose=*/ctx->needs_input_grad(1));
    // One per forward argument (input, weight, bias, state, dtype, the two
    // flags).
    torch::autograd::variable_list grads(7);
    if (ctx->needs_input_grad(0)) {
      TORCH_INTERNAL_ASSERT(w_t.defined(), "lamp::nn::float8_linear: layer '",
                            name, "': W^T was not kept for dX");
      // dX = dY W: W [n, k] as the column-major second operand.
      const Operand w_col{w_t.t(), saved[3]};
      auto dx = scaled_mm({dy.data, dy.inverse_scale}, w_col, input_dtype, {},
                          /*fast_accum=*/false, name, "dX = dY W");
      std::vector<int64_t> in_shape(grad.sizes().begin(), grad.sizes().end());
      in_shape.back() = k;
      grads[0] = dx.narrow(0, 0, m).view(in_shape);
    }
    if (ctx->needs_input_grad(1)) {
      TORCH_INTERNAL_ASSERT(x_t.defined(), "lamp::nn::float8_linear: layer '",
                            name, "': X^T was not kept for dW");
      // dW = dY^T X: dY^T row-major, X column-major.
      const Operand dy_t{dy.transposed, dy.inverse_scale};
      const Operand x_col{x_t.t(), saved[1]};
      grads[1] = scaled_mm(dy_t, x_col, weight_dtype, {}, /*fast_accum=*/false,
                           name, "dW = dY^T X");
    }
    if (d.at("has_bias").toBool() && ctx->needs_input_grad(2)) {
      grads[2] = grad.reshape({m, n})
                     .sum(0, /*keepdim=*/false, torch::kFloat)
                     .to(d.at("bias_dtype").toScalarType());
    }
    return grads;
  }
};

} // namespace
#endif // LAMP_TORCH_FLOAT8

torch::Tensor float8_linear(const torch::Tensor& input,
                            const torch::Tensor& weight,
                            const torch::Tensor& bias, Float8StateImpl& state) {
  const std::string who =
      "lamp::nn::float8_linear: layer '" + state.name() + "'";
  detail::check_linear_arguments(input, weight, bias, who);
  for (const auto* t : {&input, &weight}) {
    TORCH_CHECK(
        t->scalar_type() == torch::kFloat || is_low_precision(t->scalar_type()),
        who, ": FP8 layers take FP32, BF16 or FP16 inputs and weights, got ",
        t->scalar_type(), ".");
  }
  TORCH_CHECK(input.device() == weight.device() &&
                  state.scale.device() == weight.device(),
              who, ": the input (", input.device(), "), the weight (",
              weight.device(), ") and the FP8 state (", state.scale.device(),
              ") must be on one device; move the model with model->to(device) "
              "after convert_to_float8.");
  const auto reason = float8_unavailable_reason(input.device());
  TORCH_CHECK(reason.empty(), who, ": FP8 cannot run: ", reason, ".");
  // What convert_to_float8() checks, checked here for a direct call before
  // any cast is made (the product's own check comes after the casts, which
  // would have counted and moved the layer's amaxes). The rows are padded.
  TORCH_CHECK(weight.size(0) % 16 == 0 && weight.size(1) % 16 == 0, who,
              ": CUDA's _scaled_mm needs the weight's sizes to be multiples "
              "of 16, got ",
              weight.sizes(),
              "; keep this layer out of convert_to_float8 (its predicate) or "
              "give it sizes that are multiples of 16.");
#if LAMP_TORCH_FLOAT8
  if (input.numel() == 0 || weight.numel() == 0) {
    // No rows, no in features or no out features: no amax to scale by
    // (aminmax refuses an empty tensor) and nothing to compute, so the
    // unconverted product's result and gradients, with no cast recorded.
    return linear(input, weight, bias);
  }
  const auto device_type = input.device().type();
  const auto out_dtype = lamp::detail::autocast_enabled(device_type)
                             ? lamp::detail::autocast_dtype(device_type)
                             : input.scalar_type();
  // Autocast's casts stay out of the products' operands: the FP8 casts read
  // the FP32 weight itself.
  const bool grad = torch::GradMode::is_enabled();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return Float8LinearFunction::apply(
      input, weight,
      bias.defined() ? bias : torch::empty({0}, weight.options()), &state,
      out_dtype, grad && input.requires_grad(), grad && weight.requires_grad());
#else
  return {};
#endif
}

} // namespace nn
} // namespace lamp
