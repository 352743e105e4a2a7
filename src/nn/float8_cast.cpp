// The FP8 casts: a format's range, the scale from an amax, the cast
// itself, and the cast of a product's operand with its layer's state.
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>

#include "nn/float8_cast_cuda.h"
#include "nn/float8_internal.h"
#include "platform/compat.h"

namespace lamp {
namespace nn {
namespace {

// torchao's floor under an amax (float8_utils.EPS): an all-zero tensor gets
// a finite scale.
constexpr double kAmaxFloor = 1e-12;

} // namespace

namespace detail {

double float8_max(torch::Dtype dtype) {
#if LAMP_TORCH_FLOAT8
  if (dtype == c10::ScalarType::Float8_e4m3fn) {
    return 448.0;
  }
  if (dtype == c10::ScalarType::Float8_e5m2) {
    return 57344.0;
  }
#endif
  TORCH_CHECK(false, "lamp::nn::float8: ", dtype,
              " is not an FP8 format lamp casts to (E4M3 or E5M2).");
}

torch::Tensor amax_to_scale(const torch::Tensor& amax, double max,
                            int64_t margin) {
  return (max / std::ldexp(1.0, static_cast<int>(margin))) /
         amax.to(torch::kFloat).clamp_min(kAmaxFloor);
}

torch::Tensor cast_to_float8(const torch::Tensor& t, const torch::Tensor& scale,
                             torch::Dtype dtype, bool saturate) {
  const double max = float8_max(dtype);
  // The scale as a one-element 1-D tensor: it then takes part in type
  // promotion (a 0-D one would not), so a BF16 or FP16 `t` is widened to
  // FP32 inside the multiplication's kernel instead of by a copy of its
  // own, and the product is never rounded to 16 bits. The product is a new
  // FP32 tensor (never `t` itself), clamped in place: a value past the range
  // becomes +-max (saturation), never a NaN, whatever the LibTorch's
  // conversion does with it. An infinite value of `t` is no value past the
  // range but an overflow that happened before: it becomes NaN (in both
  // formats, whatever the conversion does with inf), so that a loss scaler
  // or a non-finite check downstream sees it instead of +-max. Adding 0 * t
  // does that in one pass with no temporary (0 * inf is NaN; for a finite
  // t it adds a zero of t's sign, the product's own, which changes no bit):
  // an isinf mask and masked_fill_ made the cast 4.7 times slower on a CPU.
  auto scaled = t * scale.to(torch::kFloat).reshape({1});
  if (saturate) {
    scaled.add_(t, /*alpha=*/0).clamp_(-max, max);
  }
  return scaled.to(dtype);
}

} // namespace detail

std::string float8_fused_casts_path(const torch::Tensor& t) {
  const auto why = internal::fused_cast_unavailable_reason(t);
  return why.empty() ? "lamp's CUDA kernels" : "ATen ops: " + why;
}

#if LAMP_TORCH_FLOAT8
namespace internal {

OperandState operand_state(Float8StateImpl& state, int64_t operand) {
  return {state.scale[operand],
          state.pending_amax[operand],
          state.counters[kSaturated][operand],
          state.counters[kNonFinite][operand],
          state.counters[kLastScale][operand],
          state.counters[kCasts][operand]};
}

Cast cast_operand(const torch::Tensor& t, const OperandState& s, bool delayed,
                  int64_t margin, torch::Dtype dtype, bool fused,
                  bool transpose) {
  // A transposed cast takes a 2-D `t`: fused_cast_operand checks it before
  // its kernel indexes rows and columns; ATen's t() refuses more dimensions.
  if (fused && t.is_cuda()) {
    const auto why = fused_cast_unavailable_reason(t);
    if (why.empty()) {
      return fused_cast_operand(t, s, delayed, margin, dtype, transpose);
    }
    TORCH_WARN_ONCE("lamp::nn::float8: Float8Recipe::fused_casts runs ATen ",
                    "ops instead of lamp's CUDA kernel: ", why, ".");
  }
  // _scaled_mm takes its operands row-major (or their transposes), and the
  // cast keeps its input's strides: a transposed input or a gradient from a
  // .t() is made contiguous first, as the fused cast does.
  const auto input = t.contiguous();
  const double max = detail::float8_max(dtype);
  // max |t| = max(-min t, max t): one pass over t with no |t| temporary,
  // exact in t's dtype, NaN propagating as with abs().amax(). (On LibTorch
  // 2.15's CPU, aminmax takes a third of abs().amax()'s time, and
  // linalg_vector_norm(t, inf) ten times it.)
  const auto extrema = torch::aminmax(input);
  const auto amax =
      torch::maximum(std::get<0>(extrema).neg(), std::get<1>(extrema))
          .to(torch::kFloat);
  const auto finite = torch::isfinite(amax);
  s.non_finite.add_(finite.logical_not());
  torch::Tensor scale;
  if (delayed) {
    scale = s.scale;
    s.pending_amax.copy_(torch::where(
        finite, torch::maximum(s.pending_amax, amax), s.pending_amax));
    s.saturated.add_(torch::logical_and(
        finite, amax * scale > max * internal::kSaturationSlack));
  } else {
    scale = detail::amax_to_scale(amax, max, margin);
  }
  s.last_scale.copy_(scale);
  s.casts.add_(1);
  // A scale from t's own amax cannot take a value past the range: no clamp
  // (a pass over t fewer). Delayed scales come from earlier amaxes.
  auto data = detail::cast_to_float8(input, scale, dtype, /*saturate=*/delayed);
  auto transposed = transpose ? data.t().contiguous() : torch::Tensor();
  return {std::move(data), scale.reciprocal(), std::move(transposed)};
}

} // namespace internal
#endif // LAMP_TORCH_FLOAT8

} // namespace nn
} // namespace lamp
