#pragma once

/// \file
/// lamp::nn::CastWeightsOnce: autocast's casts of a model's Linear weights,
/// all made in one multi-tensor operation at the forward's start, and their
/// gradients cast back in one at the backward's end. Autocast casts each
/// FP32 weight and bias as its layer runs: two small kernels per tensor and
/// step (the cast, then its gradient's cast back), 96 for a 6-block GPT
/// with biases, which at a GPT's small widths are launch-bound (on an H200
/// the small GPT's copy kernels, most of them these, were 9.7% of its step,
/// as many in PyTorch's own whole-step graph).

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <string>
#include <unordered_map>

namespace lamp {
namespace nn {

/// While it lives, lamp::nn::linear() of every torch::nn::Linear in the
/// module it was given uses that layer's weight and bias already cast to
/// autocast's dtype: the casts autocast would make one at a time, made at
/// construction in one multi-tensor operation (at::_foreach_copy_; a copy
/// each on LibTorch 1.13), with one autograd node whose backward casts all
/// their gradients back to FP32 at once.
///
/// - What is cast: the FP32 weights and biases of the module's Linear
///   layers (itself included), when autocast is on for their device (CPU
///   or CUDA) at construction, to that device's autocast dtype. Layers that
///   lamp::nn::convert_to_float8() converted keep their own casts. Nothing
///   is cast where autocast is off: then the guard changes nothing.
/// - The results are autocast's to the bit, forward and backward: each
///   cast rounds as autocast's, each gradient is the same FP32 value (a
///   16-bit gradient converted exactly). A parameter two layers use in one
///   forward is cast once, and autograd sums its two 16-bit gradients
///   before the cast back, as with autocast's cast cache (on by default);
///   with that cache off autocast would cast each use and sum in FP32.
/// - A parameter that does not require grad (a frozen layer), and every
///   one when grad mode is off, is cast without an autograd node: no
///   gradient is computed or cast back for it, as with autocast's cast.
/// - Gradients: the FP32 parameters' gradients arrive together when the
///   last of their layers' backward has run (the autograd node waits for
///   all of them), not layer by layer: a data-parallel hook that reduces
///   gradients as they become ready sees them at the end. The 16-bit
///   gradients are held until then (2 bytes a parameter).
/// - One forward: the casts are the parameters' values at construction;
///   construct it after the optimizer's step and destroy it before the
///   next (a scope around the forward). Guards nest, the innermost wins;
///   one destroyed before a guard made after it (std::optional or heap
///   guards, reset out of order) leaves the nesting, and the others keep
///   handing out their casts. The guard is the calling thread's (as
///   autocast's state is): construct and destroy it on one thread.
///
/// Example (what lamp::models::GPT does with GPTOptions::fused_weight_cast):
/// \code
///   lamp::Autocast autocast(torch::kCUDA, torch::kBFloat16);
///   torch::Tensor loss;
///   {
///     lamp::nn::CastWeightsOnce casts(*model);  // one cast for all layers
///     loss = model->loss(tokens, targets);      // linear() uses them
///   }
///   loss.backward();  // one cast back for all gradients
/// \endcode
class CastWeightsOnce {
 public:
  /// Casts `module`'s Linear weights and biases (see the class comment).
  explicit CastWeightsOnce(torch::nn::Module& module);
  ~CastWeightsOnce();
  CastWeightsOnce(const CastWeightsOnce&) = delete;
  CastWeightsOnce& operator=(const CastWeightsOnce&) = delete;

  /// How many tensors it cast: 0 where autocast was off.
  size_t size() const { return casts_.size(); }

  /// The cast of `parameter` this guard made, or an undefined tensor.
  torch::Tensor find(const torch::Tensor& parameter) const;

 private:
  friend torch::Tensor cast_weight(const torch::Tensor& parameter);

  std::unordered_map<const void*, torch::Tensor> casts_;
  /// The guard that was innermost when this one was made, or nullptr:
  /// cast_weight() walks the thread's guards from the innermost outwards.
  CastWeightsOnce* outer_;
  /// The guard made next, inside this one, while it lives, or nullptr.
  CastWeightsOnce* inner_ = nullptr;
};

/// `parameter` as the calling thread's innermost live CastWeightsOnce cast
/// it, else `parameter` itself: what lamp::nn::linear() and lamp's fused
/// ops (lamp::ops::gelu_mlp through lamp::models::GPT) apply to the
/// weights they are given. The cast is handed out only while it is still
/// what autocast would make: autocast on for the parameter's device with
/// the cast's dtype, and the parameter FP32 on the cast's device. A region
/// inside the guard that turns autocast off or changes its dtype, or a
/// module moved while the guard lives, gets `parameter` itself (and
/// autocast's own cast, where it is on).
torch::Tensor cast_weight(const torch::Tensor& parameter);

/// How CastWeightsOnce casts on `device` with this LibTorch, for a run's
/// report: "multi-tensor kernels each way (at::_foreach_copy_)" on CUDA
/// (ATen's fast path: one launch per 320 chunks of 65,536 elements);
/// on other devices at::_foreach_copy_'s copy per tensor; on LibTorch 1.13,
/// which has no at::_foreach_copy_, a copy per tensor, said with the
/// version.
std::string cast_weights_once_path(const torch::Device& device);

} // namespace nn
} // namespace lamp
