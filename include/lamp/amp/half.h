#pragma once

/// \file
/// The FP16/BF16 conversion pass: fastai's `network_to_half`, `tofp16` and
/// `BN_convert_float`, and Apex's `convert_network`.

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

namespace lamp {

/// Options of network_to_half() and convert_network().
struct HalfOptions {
  /// Decides, for a module and its qualified name in the tree ("layer1.0.bn1";
  /// "" for the root), whether it and everything under it stays FP32.
  using KeepPredicate = std::function<bool(const std::string& qualified_name,
                                           const torch::nn::Module& module)>;

  /// Options converting to `dtype` with the defaults below; implicit, so that
  /// a dtype converts to options: `network_to_half(model, torch::kBFloat16)`.
  /* implicit */ HalfOptions(torch::Dtype dtype = torch::kHalf)
      : dtype_(dtype) {}

  /// The low-precision dtype: torch::kHalf or torch::kBFloat16.
  TORCH_ARG(torch::Dtype, dtype);
  /// Keep BatchNorm1d/2d/3d (affine or not) in FP32: weight, bias and running
  /// statistics. BatchNorm statistics over a batch need FP32's range. Known
  /// by type (lamp::nn::is_batch_norm(): LibTorch's classes and those derived
  /// from them); a BatchNorm of your own (over torch::nn::BatchNormImplBase,
  /// a SyncBatchNorm) is not, where Apex's isinstance(_BatchNorm) would
  /// know it: keep it with keep_fp32.
  TORCH_ARG(bool, keep_batchnorm_fp32) = true;
  /// Also keep LayerNorm, GroupNorm and InstanceNorm1d/2d/3d in FP32. Needs
  /// LayerNorm/GroupNorm kernels that take low-precision inputs with FP32
  /// parameters (LibTorch 2.x's CPU; not 1.13's CPU, nor CUDA's): see
  /// lamp::mixed_dtype_norm_available(). Where they are missing, conversion
  /// refuses with an error instead of a model that fails at forward, and
  /// so does the HalfNetwork's forward on inputs of a device without them
  /// (a model converted on the CPU and moved to a GPU). Subtrees kept by
  /// keep_fp32 are not checked: they cast their inputs themselves.
  TORCH_ARG(bool, keep_norm_fp32) = false;
  /// Keep any module for which this returns true (and its subtree) in FP32.
  TORCH_ARG(KeepPredicate, keep_fp32) = nullptr;
};

/// fastai's `tofp16`: casts floating-point inputs to its dtype; integer and
/// boolean tensors pass through unchanged.
///
/// \warning On CPU with FP16, when this LibTorch has no FP16 convolution or
/// matmul kernels (LibTorch 1.13), forward() refuses with an error that says so
/// and suggests BF16, instead of letting the first convolution fail deep in
/// ATen.
class InputCastImpl : public torch::nn::Cloneable<InputCastImpl> {
 public:
  /// A cast to `dtype`: torch::kHalf or torch::kBFloat16, anything else is a
  /// TORCH_CHECK error.
  explicit InputCastImpl(torch::Dtype dtype = torch::kHalf);
  /// Nothing to reset: the module has no parameters or buffers.
  void reset() override {}
  /// `input` cast to dtype() if it is floating point (a copy unless it is
  /// already), else `input` itself.
  torch::Tensor forward(const torch::Tensor& input);
  /// The dtype floating-point inputs are cast to.
  torch::Dtype dtype() const { return dtype_; }
  /// Prints `lamp::InputCast(dtype=Half)` (or BFloat16).
  void pretty_print(std::ostream& stream) const override;

 private:
  torch::Dtype dtype_;
};
/// The module holder of InputCastImpl: `InputCast(torch::kBFloat16)`.
TORCH_MODULE(InputCast);

/// Casts, in place, every floating-point parameter and buffer of `module`'s
/// tree to `options.dtype()`, except in the modules `options` keeps in FP32
/// (BatchNorm by default). Integer buffers such as BatchNorm's
/// `num_batches_tracked` keep their dtype. Parameters keep their identity
/// (`set_data`), so optimizers and references to them stay valid; existing
/// gradients are cast with them. Returns `module`.
///
/// This is the conversion half of network_to_half(), for models that are not
/// a `TORCH_MODULE` holder or whose inputs are cast elsewhere. Like fastai's
/// recipe it keeps every BatchNorm in FP32, affine or not (Apex's
/// `convert_network` keeps only affine ones); RNN, LSTM and GRU weights are
/// re-flattened for cuDNN afterwards, as Apex does.
torch::nn::Module& convert_network(torch::nn::Module& module,
                                   const HalfOptions& options = {});

/// fastai's `BN_convert_float`: puts every BatchNorm1d/2d/3d in `module`'s
/// tree back to FP32 (parameters and floating buffers). Returns `module`.
torch::nn::Module& bn_convert_float(torch::nn::Module& module);

/// The model network_to_half() returns: `model` converted in place, behind
/// an input cast. It registers the model's own parameters, buffers and
/// children under their names, so that its named_parameters(), state dict
/// and checkpoints read exactly as the model's (fastai's Sequential would
/// prefix every name with "1."); train()/eval() reach the model too.
class HalfNetworkImpl : public torch::nn::Module {
 public:
  /// Wraps `model` (already converted with `options`, or a dtype) with
  /// `forward` running it, behind an InputCast to options.dtype().
  HalfNetworkImpl(std::shared_ptr<torch::nn::Module> model,
                  std::function<torch::Tensor(const torch::Tensor&)> forward,
                  const HalfOptions& options);
  /// `forward` of the model on `input` cast to dtype() (floating inputs;
  /// others pass unchanged). With HalfOptions::keep_norm_fp32, refuses (on
  /// the first input of each device) norms kept in FP32 that the model's
  /// device cannot run on low-precision inputs.
  torch::Tensor forward(const torch::Tensor& input);
  /// The dtype inputs are cast to: torch::kHalf or torch::kBFloat16.
  torch::Dtype dtype() const { return cast_->dtype(); }
  /// The converted model.
  const std::shared_ptr<torch::nn::Module>& model() const { return model_; }
  /// Sets training mode on this module, its children and the model itself.
  void train(bool on = true) override;
  /// Prints `lamp::HalfNetwork(dtype=Half)` (or BFloat16).
  void pretty_print(std::ostream& stream) const override;

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
  HalfOptions options_;
  InputCast cast_;
  c10::optional<torch::Device> checked_device_;
};
/// The module holder of HalfNetworkImpl, as network_to_half() returns it.
TORCH_MODULE(HalfNetwork);

/// network_to_half() for a module whose forward is a separate function (a
/// model built by name, lamp::models::make_model()); see the overloads
/// below.
HalfNetwork network_to_half(
    std::shared_ptr<torch::nn::Module> model,
    std::function<torch::Tensor(const torch::Tensor&)> forward,
    const HalfOptions& options = {});

/// fastai's `network_to_half`, keeping parameter names: converts `model` in
/// place with convert_network() and returns it behind an InputCast, as a
/// HalfNetwork that holds the very same module object, not a copy, and
/// names its parameters as the model does.
///
/// Steps:
///  1. every floating parameter and buffer goes to FP16 (or BF16);
///  2. BatchNorm (and, if asked, the other norms and the modules chosen by
///     `keep_fp32`) goes back to FP32;
///  3. an InputCast in front casts the inputs, so callers feed FP32 data.
///
/// Example:
/// \code
///   auto model = MyNet();
///   auto half_model = lamp::network_to_half(model);  // FP16, BatchNorm FP32
///   auto bf16_model = lamp::network_to_half(
///       other, lamp::HalfOptions(torch::kBFloat16).keep_norm_fp32(true));
///   torch::Tensor logits = half_model->forward(images).to(torch::kFloat);
/// \endcode
///
/// \warning The output is low precision: compute the loss in FP32
/// (`.to(torch::kFloat)`), and train with lamp::MasterWeights and a
/// lamp::GradScaler (lamp::TrainStep does both). Parameters' gradients are
/// FP16 and stay *scaled* until copied to the master weights and unscaled
/// there.
/// \warning A module kept in FP32 receives low-precision inputs. BatchNorm
/// handles that (cuDNN and ATen accept FP16/BF16 input with FP32 statistics);
/// other kept modules must cast their input themselves.
template <typename ModuleType>
HalfNetwork network_to_half(torch::nn::ModuleHolder<ModuleType> model,
                            const HalfOptions& options = {}) {
  auto module = model.ptr();
  return network_to_half(
      module,
      [model](const torch::Tensor& x) mutable { return model->forward(x); },
      options);
}

/// network_to_half() for a module held by a `std::shared_ptr` (made with
/// `std::make_shared` rather than a `TORCH_MODULE` holder).
template <typename ModuleType>
HalfNetwork network_to_half(std::shared_ptr<ModuleType> model,
                            const HalfOptions& options = {}) {
  return network_to_half(torch::nn::ModuleHolder<ModuleType>(std::move(model)),
                         options);
}

namespace detail {
/// TORCH_CHECKs that `dtype` is one network_to_half() can convert to.
void check_half_dtype(torch::Dtype dtype, const char* caller);
} // namespace detail

} // namespace lamp
