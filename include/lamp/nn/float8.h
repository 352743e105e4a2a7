#pragma once

/// \file
/// FP8 training of Linear layers: y = x W^T + b as `at::_scaled_mm` matrix
/// products (twice BF16's rate on Hopper and Ada tensor cores), with E4M3
/// activations and weights, E5M2 gradients, per-tensor scales picked by a
/// recipe (current or delayed scaling), and a hand-written backward
/// (LibTorch's _scaled_mm has none):
///
///   1. forward   Y  = X  W^T   E4M3 x E4M3
///   2. backward  dX = dY W     E5M2 x E4M3
///   3. backward  dW = dY^T X   E5M2 x E4M3
///
/// Each operand is cast as fp8(clamp(t * scale, -max, max)), max being the
/// format's largest finite value (448 for E4M3, 57344 for E5M2); the product
/// is multiplied back by 1 / (scale_a * scale_b) in FP32 and written in the
/// output dtype. The bias, dB and everything outside the three products stay
/// in the caller's precision.
///
/// CUDA's rules for _scaled_mm are checked on every device, so a shape that
/// would fail on a GPU fails on the CPU (whose emulated _scaled_mm accepts
/// anything) with the same message: every dimension a multiple of 16, the
/// first operand row-major and the second column-major, never E5M2 on both
/// sides. A Linear whose in or out features are 0 or not multiples of 16 is
/// not converted (the conversion says so and why); rows of the input (batch
/// x sequence) that are not a multiple of 16 are padded with zero rows, which
/// change neither the products nor the amaxes, and an input or gradient of
/// any strides (a transposed one) is cast into the layout the product takes.
/// An input without rows gives the unconverted product's empty result.
///
/// Needs LibTorch 2.x with float8 types, and a CUDA GPU of compute
/// capability 8.9 or newer or a LibTorch with the CPU emulation
/// (float8_unavailable_reason()).

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lamp {
namespace nn {

/// How a converted layer picks the scale of a tensor before its FP8 cast.
enum class Float8Scaling {
  /// "current": from this tensor's own amax (max |t|), at every cast:
  /// nothing saturates, at the cost of one reduction per operand before
  /// its cast (torchao's "tensorwise" scaling, its default).
  kCurrent,
  /// "delayed": from the amaxes of earlier steps (the amax history), as
  /// Transformer Engine's DelayedScaling: the cast does not wait for a
  /// reduction, and a tensor larger than the history foresaw saturates for
  /// one step (counted, Float8LayerStats::saturated_casts).
  kDelayed,
};

/// How delayed scaling reads the amax history.
enum class Float8AmaxCompute {
  kMax,        ///< "max": the largest amax in the history (TE's default).
  kMostRecent, ///< "most_recent": the amax of the last step.
};

/// A recipe of FP8 scaling, with Transformer Engine's names and defaults
/// (format HYBRID: E4M3 forward, E5M2 gradients).
struct Float8Recipe {
  /// Current or delayed scaling.
  TORCH_ARG(Float8Scaling, scaling) = Float8Scaling::kCurrent;
  /// Delayed scaling: how many steps' amaxes are remembered per tensor
  /// (TE: amax_history_len, 1024).
  TORCH_ARG(int64_t, amax_history_len) = 1024;
  /// Delayed scaling: how the history gives the amax (TE:
  /// amax_compute_algo, "max").
  TORCH_ARG(Float8AmaxCompute, amax_compute) = Float8AmaxCompute::kMax;
  /// scale = max / amax / 2^margin: a margin of m leaves 2^m of headroom
  /// (TE: margin, 0). Both recipes.
  TORCH_ARG(int64_t, margin) = 0;
  /// Each cast in one pass over its tensor on lamp's CUDA kernel (delayed
  /// scaling: the cast, its amax and the state's updates in one kernel;
  /// current scaling: the amax and the scale, then the cast; the transpose
  /// the backward's products take written by the cast's pass; delayed
  /// scaling's update_float8_scales() in one kernel launch per 64 layers),
  /// instead of ATen's amax, scale, clamp and convert and the update's ten
  /// kernels a layer: the same FP8 bits, scales and counters. Elsewhere (a CPU, a lamp built without its CUDA kernels) the
  /// ATen ops, after one warning on CUDA. Not saved with the state: a
  /// checkpoint resumes with it on or off. Off by default until a GPU run
  /// has measured it.
  TORCH_ARG(bool, fused_casts) = false;
};

/// The operands a converted layer casts, in the order of its state.
enum class Float8Operand {
  kInput = 0,      ///< the activation X (E4M3).
  kWeight = 1,     ///< the weight W (E4M3).
  kGradOutput = 2, ///< the gradient dY (E5M2).
};

/// What a converted layer saw since it was converted or reset (see
/// float8_stats()).
struct Float8LayerStats {
  /// The layer's name in the model ("h.0.mlp.c_fc").
  std::string name;
  /// Per operand (Float8Operand order): casts whose tensor exceeded the
  /// range its scale allowed, by more than FP32's rounding, and was clamped
  /// to the format's max (delayed scaling after a jump; current scaling
  /// never saturates).
  std::vector<int64_t> saturated_casts;
  /// Per operand: casts whose amax was inf or NaN. Delayed scaling keeps
  /// such an amax out of the history (a NaN would otherwise freeze the
  /// scale for amax_history_len steps), and casts an infinite value to NaN,
  /// not to +-max, so that the overflow reaches the loss scaler.
  std::vector<int64_t> non_finite_casts;
  /// Per operand: the scale the next cast uses (delayed), or the last
  /// cast used (current).
  std::vector<double> scales;
  /// Per operand: the casts made (0 for a layer the model never applied
  /// through lamp::nn::linear).
  std::vector<int64_t> casts;
};

/// The FP8 state of one converted Linear: its recipe, and per operand the
/// scale, the amax history and the amax of the step under way. A child
/// module named "float8" of the torch::nn::Linear it converts, with no
/// parameters or buffers, so the Linear's state dict is unchanged (the
/// state is saved with save_float8_state(), which TrainStep calls).
class Float8StateImpl : public torch::nn::Cloneable<Float8StateImpl> {
 public:
  /// The state of a Linear called `name` in its model.
  Float8StateImpl(Float8Recipe recipe, std::string name);

  /// Makes the state tensors (scales 1, histories and amaxes 0, counters
  /// 0) on the CPU; the conversion moves them to the weight's device.
  void reset() override;
  /// Moves the state tensors with the module (model->to(device)).
  void to(torch::Device device, torch::Dtype dtype,
          bool non_blocking = false) override;
  /// Nothing: the state stays FP32 in a model converted to another dtype.
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  /// Moves the state tensors to `device`.
  void to(torch::Device device, bool non_blocking = false) override;
  /// false: torch::save(model) leaves the state out (it has no parameters
  /// or buffers; save_float8_state() saves it), so a converted model's
  /// archive is an unconverted one's and torch::load reads either into
  /// either.
  bool is_serializable() const override { return false; }

  /// The recipe the layer was converted with.
  const Float8Recipe& recipe() const { return recipe_; }
  /// The layer's name in its model.
  const std::string& name() const { return name_; }

  /// Per operand, the scale of its next cast ([3] FP32; delayed scaling).
  torch::Tensor scale;
  /// Per operand, its amax history ([3, amax_history_len] FP32; delayed
  /// scaling; row 0 of the history the newest step).
  torch::Tensor amax_history;
  /// Per operand, the largest finite amax of the casts since the last
  /// update_float8_scales() ([3] FP32).
  torch::Tensor pending_amax;
  /// Per operand: saturated casts, non-finite casts, the scale of the last
  /// cast, and the casts made ([4, 3] FP32, rows in that order; counts stay
  /// exact to 2^24).
  torch::Tensor counters;

 private:
  Float8Recipe recipe_;
  std::string name_;
};
/// A module holder of Float8StateImpl.
TORCH_MODULE(Float8State);

/// What convert_to_float8() did.
struct Float8Conversion {
  /// The Linear layers now computed in FP8, by name.
  std::vector<std::string> converted;
  /// The Linear layers left as they were, with the reason.
  std::vector<std::pair<std::string, std::string>> skipped;
};

/// Which Linear layers to convert: given the layer's name in the model and
/// the layer, true to convert it.
using Float8Predicate =
    std::function<bool(const std::string&, const torch::nn::LinearImpl&)>;

/// Marks the model's torch::nn::Linear layers for FP8 (a child "float8"
/// holding a Float8State) after float8_unavailable_reason() allows it for
/// the weights' device. The layers then compute in FP8 when applied
/// through lamp::nn::linear(input, layer) (lamp/nn/linear.h), as
/// lamp::models::GPT does; `layer->forward(x)` stays LibTorch's. Parameters,
/// their names and the state dict are unchanged, so checkpoints and Python
/// state dicts load as before.
///
/// A layer is converted when `predicate` (default: all) accepts it and it
/// is eligible: FP32, BF16 or FP16 weights; in and out features non-zero
/// multiples of 16 (CUDA's rule); a weight no other module shares (a tied
/// embedding would be cast once per use). The others are listed with the
/// reason. Converting a model twice is an error naming the first converted
/// layer.
///
/// Example:
/// \code
///   auto report = lamp::nn::convert_to_float8(*model);
///   lamp::Autocast autocast(torch::kCUDA, torch::kBFloat16);
///   auto loss = loss_fn(model->forward(x), y);  // FP8 GEMMs, BF16 around
///   loss.backward();
///   lamp::nn::update_float8_scales(*model);     // delayed scaling: after
///                                               // each backward
/// \endcode
/// \warning Delayed scaling needs update_float8_scales() after every
/// backward (TrainStep calls it); without it the scales stay at 1.
/// \warning A converted model cannot be clone()d: LibTorch's
/// Cloneable::clone() rebuilds each Linear with reset(), which registers no
/// "float8" child, and refuses it ("does not have the same number of child
/// modules"). Clone before converting and convert the clone;
/// save_float8_state() and load_float8_state() carry the scales across.
Float8Conversion convert_to_float8(torch::nn::Module& model,
                                   const Float8Recipe& recipe = {},
                                   const Float8Predicate& predicate = nullptr);

/// The layer's FP8 state, or nullptr when it is not converted.
Float8StateImpl* float8_state(const torch::nn::LinearImpl& layer);

/// Whether the model has a layer convert_to_float8() converted.
bool has_float8_layers(const torch::nn::Module& model);

/// Every torch::nn::Linear of `model` that does not compute in FP8, by name
/// (named_modules() order), with the reason convert_to_float8() gives for
/// it (its weight's dtype or shape, a tied weight), or "left out by the
/// conversion's predicate (eligible otherwise)". lamp::precision_report()
/// shows these beside the layers' weights.
std::vector<std::pair<std::string, std::string>> float8_left_out(
    const torch::nn::Module& model);

/// y = input weight^T + bias in FP8 (the file comment's three products),
/// with `state`'s recipe. The output dtype is the autocast dtype of the
/// input's device where autocast is on, else the input's; dX is in the
/// input's dtype and dW in the weight's. The input and the incoming gradient
/// may have any strides. An input without elements (no rows) gives
/// torch::linear's empty result and gradients, and records no cast. Errors
/// name the layer and the shape that breaks a rule. Differentiable once: a
/// backward with create_graph=true refuses (leave the layer out of
/// convert_to_float8() for higher-order gradients).
torch::Tensor float8_linear(const torch::Tensor& input,
                            const torch::Tensor& weight,
                            const torch::Tensor& bias, Float8StateImpl& state);

/// Ends a step of delayed scaling in every converted layer: each operand's
/// pending amax (the largest finite amax since the last call) enters its
/// history, the scale of the next step becomes max / amax / 2^margin with
/// the amax the recipe reads from the history (kept where that amax is 0;
/// at most the largest finite float, as Transformer Engine clamps it, where
/// a tiny amax would make it inf), and the pending amaxes restart.
/// `all_reduce_max`, when given, replaces a tensor of every layer's pending
/// amaxes by their maximum over the ranks before that (data-parallel
/// replicas then agree on the scales). Without tensor-to-host copies: it
/// can be captured in a CUDA graph. Current scaling has nothing to update.
void update_float8_scales(
    torch::nn::Module& model,
    const std::function<void(torch::Tensor&)>& all_reduce_max = nullptr);

/// Every converted layer's counters (a host copy: it waits for the device).
std::vector<Float8LayerStats> float8_stats(const torch::nn::Module& model);

/// Writes every converted layer's scales, histories and counters under
/// "float8/<layer name>/...", with each layer's recipe.
void save_float8_state(const torch::nn::Module& model,
                       torch::serialize::OutputArchive& archive);

/// Reads what save_float8_state() wrote into the converted layers of
/// `model`, exactly, all or nothing: every layer is checked before the
/// first is loaded. Errors name the layer when the archive lacks it, has
/// another recipe (history length, margin, ...) or damaged tensors: of
/// another shape or dtype, a scale not finite and > 0, an amax or counter
/// not finite and >= 0.
void load_float8_state(torch::nn::Module& model,
                       torch::serialize::InputArchive& archive);

/// The checks of load_float8_state(), loading nothing.
void check_float8_state(const torch::nn::Module& model,
                        torch::serialize::InputArchive& archive);

/// Why FP8 cannot run on `device` with this LibTorch ("" when it can): a
/// LibTorch without float8 types (1.13), a CUDA GPU below compute
/// capability 8.9, a CPU LibTorch without the emulated _scaled_mm.
std::string float8_unavailable_reason(const torch::Device& device);

/// Which code Float8Recipe::fused_casts runs for operands like `t` (and for
/// update_float8_scales() on t's device): "lamp's CUDA kernels", or "ATen
/// ops: " followed by why (not a CUDA tensor; lamp built without its CUDA
/// kernels; a dtype the kernels do not cast). A CUDA operand the kernels
/// cannot take runs the ATen ops, with this reason given once as a warning.
std::string float8_fused_casts_path(const torch::Tensor& t);

namespace detail {

/// CUDA's rules for `at::_scaled_mm(a, b, ...)`, checked on every device:
/// both FP8 and 2-D, a [M, K] row-major, b [K, N] column-major, M, K and N
/// multiples of 16, not both E5M2. `layer` and `product` ("dW = dY^T X")
/// name the failure.
void check_scaled_mm_operands(const torch::Tensor& a, const torch::Tensor& b,
                              const std::string& layer,
                              const std::string& product);

/// fp8(clamp(t * scale, -max, max)) in `dtype` (E4M3 or E5M2); `scale` a
/// one-element FP32 tensor; an infinite value of `t` becomes NaN (an
/// overflow upstream stays visible, never +-max). The reference of every
/// cast the layers make.
/// `saturate` false leaves the clamp out, one pass over `t` fewer, for a
/// scale made from t's own amax by amax_to_scale (current scaling): then
/// |t * scale| is at most max (1 + 2^-23), which converts to the bits its
/// clamp would give (Float8.CurrentScalingCastsNeedNoClamp). Any other
/// scale needs the clamp: past the range, what the conversion gives (NaN,
/// inf or max) differs between LibTorch versions and devices.
torch::Tensor cast_to_float8(const torch::Tensor& t, const torch::Tensor& scale,
                             torch::Dtype dtype, bool saturate = true);

/// max / clamp(amax, 1e-12) / 2^margin in FP32: the scale of a tensor whose
/// amax is `amax`, for a format whose largest finite value is `max`.
torch::Tensor amax_to_scale(const torch::Tensor& amax, double max,
                            int64_t margin);

/// The largest finite value of `dtype` (448 for E4M3, 57344 for E5M2).
double float8_max(torch::Dtype dtype);

} // namespace detail

} // namespace nn
} // namespace lamp
