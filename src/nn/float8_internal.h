#pragma once

// What the files of lamp's FP8 layers (src/nn/float8_*.cpp) share: the
// constants of a layer's state, the recipe's check, the lookups of the
// converted layers and, with float8 types, the operand casts of the FP8
// products (defined in float8_state.cpp, float8_checks.cpp and
// float8_cast.cpp).

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lamp/nn/float8.h"
#include "platform/compat.h"

namespace lamp {
namespace nn {
namespace internal {

inline constexpr const char* kStateName = "float8";
inline constexpr int64_t kOperands = 3;
// Rows of Float8StateImpl::counters.
inline constexpr int64_t kSaturated = 0;
inline constexpr int64_t kNonFinite = 1;
inline constexpr int64_t kLastScale = 2;
inline constexpr int64_t kCasts = 3;
// A delayed cast counts as saturated where its tensor's amax times the
// scale exceeds the format's max by more than FP32's rounding: a scale made
// from this very amax (a frozen weight, the same batch again) gives
// amax * scale up to max (1 + 3 2^-24), which converts to max unclamped,
// and is not a saturation. The ATen ops and the CUDA kernel share it.
inline constexpr double kSaturationSlack = 1.0 + 1.0 / (1 << 20);

// "current" or "delayed", for messages.
const char* scaling_name(Float8Scaling scaling);

// Refuses, naming `who`, a recipe with a value out of its range.
void check_recipe(const Float8Recipe& recipe, const std::string& who);

// `layer`'s FP8 state (its child "float8"), or nullptr when it has none.
Float8StateImpl* state_of(const torch::nn::Module& layer);

// `model`'s modules with their names, `model` itself first (as ""):
// named_modules() can list the top module only when it is held by a
// shared_ptr.
std::vector<std::pair<std::string, torch::nn::Module*>> modules_of(
    const torch::nn::Module& model);

// Every converted layer of `model`, in named_modules() order.
std::vector<Float8StateImpl*> states_of(const torch::nn::Module& model);

// Whether `dtype` is BF16 or FP16.
bool is_low_precision(torch::Dtype dtype);

#if LAMP_TORCH_FLOAT8
// One operand cast for a product: its FP8 data, contiguous whatever the
// layout of the tensor cast (the row-major operand _scaled_mm takes, or the
// transpose of its column-major one), and the factor that undoes its scale
// (what _scaled_mm multiplies the product by); `transposed`, when the cast
// was asked for it, is data^T contiguous (the layout the backward's products
// take it in).
struct Cast {
  torch::Tensor data;
  torch::Tensor inverse_scale;
  torch::Tensor transposed;
};

// The tensors of a layer's state that a cast reads and writes. Views of
// Float8StateImpl's tensors (writes land there), kept in the autograd
// context for the backward's cast of dY.
struct OperandState {
  torch::Tensor scale;        // [] the scale of delayed scaling
  torch::Tensor pending_amax; // []
  torch::Tensor saturated;    // []
  torch::Tensor non_finite;   // []
  torch::Tensor last_scale;   // []
  torch::Tensor casts;        // []
};

// The views of `state`'s tensors for operand `operand` (0 input, 1 weight,
// 2 grad_output).
OperandState operand_state(Float8StateImpl& state, int64_t operand);

// Casts `t` with its operand's scale, recording its amax: no value leaves
// the device. `fused` (Float8Recipe::fused_casts): in one pass on lamp's
// CUDA kernel where it takes `t` (float8_cast_cuda.h), else the ATen ops
// after one warning. `transpose` (a 2-D `t`): the cast's transpose too, in
// Cast::transposed (written by the same pass where the kernel runs, else
// data.t().contiguous()).
Cast cast_operand(const torch::Tensor& t, const OperandState& s, bool delayed,
                  int64_t margin, torch::Dtype dtype, bool fused = false,
                  bool transpose = false);
#endif // LAMP_TORCH_FLOAT8

} // namespace internal
} // namespace nn
} // namespace lamp
