#pragma once

/// \file
/// The FP16/BF16 conversion pass: fastai's `network_to_half`, `tofp16` and
/// `BN_convert_float`, and Apex's `convert_network`.

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
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

  /* implicit */ HalfOptions(torch::Dtype dtype = torch::kHalf)
      : dtype_(dtype) {}

  /// The low-precision dtype: torch::kHalf or torch::kBFloat16.
  TORCH_ARG(torch::Dtype, dtype);
  /// Keep BatchNorm1d/2d/3d (affine or not) in FP32: weight, bias and running
  /// statistics. BatchNorm statistics over a batch need FP32's range.
  TORCH_ARG(bool, keep_batchnorm_fp32) = true;
  /// Also keep LayerNorm, GroupNorm and InstanceNorm1d/2d/3d in FP32. Needs
  /// LayerNorm/GroupNorm kernels that take low-precision inputs with FP32
  /// parameters (CUDA, LibTorch 2.x CPU; not LibTorch 1.13's CPU): see
  /// lamp::mixed_dtype_norm_available(). Where they are missing, conversion
  /// refuses with an error instead of a model that fails at forward.
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
  explicit InputCastImpl(torch::Dtype dtype = torch::kHalf);
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& input);
  torch::Dtype dtype() const { return dtype_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  torch::Dtype dtype_;
};
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

/// fastai's `network_to_half`: converts `model` in place with
/// convert_network() and returns `Sequential(InputCast(dtype), model)`. The
/// Sequential holds the very same module object, not a copy.
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
/// lamp::GradScaler. Parameters' gradients are FP16 and stay *scaled* until
/// copied to the master weights and unscaled there.
/// \warning A module kept in FP32 receives low-precision inputs. BatchNorm
/// handles that (cuDNN and ATen accept FP16/BF16 input with FP32 statistics);
/// other kept modules must cast their input themselves.
template <typename ModuleType>
torch::nn::Sequential network_to_half(torch::nn::ModuleHolder<ModuleType> model,
                                      const HalfOptions& options = {}) {
  convert_network(*model, options);
  return torch::nn::Sequential(InputCast(options.dtype()), std::move(model));
}

/// \overload for a module held by `std::shared_ptr`.
template <typename ModuleType>
torch::nn::Sequential network_to_half(std::shared_ptr<ModuleType> model,
                                      const HalfOptions& options = {}) {
  return network_to_half(torch::nn::ModuleHolder<ModuleType>(std::move(model)),
                         options);
}

namespace detail {
/// TORCH_CHECKs that `dtype` is one network_to_half() can convert to.
void check_half_dtype(torch::Dtype dtype, const char* caller);
} // namespace detail

} // namespace lamp
