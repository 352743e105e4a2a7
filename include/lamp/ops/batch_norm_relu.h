#pragma once

/// \file
/// BatchNorm followed by ReLU, and BatchNorm followed by a residual addition
/// and ReLU, as one operation: the pattern of every ResNet block. On CUDA,
/// for channels_last half or bfloat16 activations in training, they run as
/// one cuDNN kernel each way (`cudnnBatchNormalizationForwardTrainingEx` /
/// `cudnnBatchNormalizationBackwardEx` with the BN_ACTIVATION and
/// BN_ADD_ACTIVATION ops), instead of three or four passes over memory;
/// everywhere else they run the stock composition, exactly.
///
/// The module forms take a `torch::nn::BatchNorm2d` and use its parameters,
/// buffers, momentum, eps and training mode as its own forward() would, so a
/// network that calls them keeps BatchNorm2d children: the same parameter and
/// buffer names ("bn1.weight", "bn1.running_mean", "bn1.num_batches_tracked"),
/// the same checkpoints, the same network_to_half() (BatchNorm stays FP32)
/// and the same precision report.
///
/// There is no process-wide switch: the caller chooses per call site, by
/// calling these or the stock ops (lamp's ResNets:
/// ResNetOptions::fused_batch_norm; the programs and lamp_bench:
/// `--fused-bn off`).
///
/// Example (a residual block's tail):
/// \code
///   auto out = lamp::ops::batch_norm_relu(conv1->forward(x), bn1);
///   out = lamp::ops::batch_norm_add_relu(conv2->forward(out), x, bn2);
/// \endcode

#include <torch/nn/modules/batchnorm.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace lamp {
namespace ops {

/// `torch::relu(bn->forward(input))`, fused where it can be (see
/// batch_norm_relu_fallback_reason()). Training mode updates `bn`'s running
/// statistics and `num_batches_tracked` exactly as bn->forward() does (the
/// momentum, or the cumulative average when momentum is unset; eps).
/// `input` is [N, C, H, W] with C = bn's num_features.
torch::Tensor batch_norm_relu(const torch::Tensor& input,
                              const torch::nn::BatchNorm2d& bn);

/// `torch::relu(bn->forward(input) + residual)`, fused where it can be.
/// `residual` has `input`'s shape; its gradient is the ReLU's.
torch::Tensor batch_norm_add_relu(const torch::Tensor& input,
                                  const torch::Tensor& residual,
                                  const torch::nn::BatchNorm2d& bn);

/// The functional form: `relu(batch_norm(input, ...))` with
/// `torch::batch_norm`'s arguments (`momentum` is the running statistics'
/// update factor; running_mean/running_var may be undefined when
/// `training`). Differentiable in input, weight and bias.
torch::Tensor batch_norm_relu(const torch::Tensor& input,
                              const torch::Tensor& weight,
                              const torch::Tensor& bias,
                              const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, bool training,
                              double momentum, double eps);

/// The functional form of batch_norm_add_relu(): `relu(batch_norm(input,
/// ...) + residual)`.
torch::Tensor batch_norm_add_relu(const torch::Tensor& input,
                                  const torch::Tensor& residual,
                                  const torch::Tensor& weight,
                                  const torch::Tensor& bias,
                                  const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var,
                                  bool training, double momentum, double eps);

/// Why batch_norm_relu()/batch_norm_add_relu() would run the stock
/// composition for these arguments, or "" when they take the fused path.
/// The fused path needs: this lamp built with cuDNN (a CUDA LibTorch whose
/// cuDNN headers were found at configure time), a CUDA input, 4-D, half or
/// bfloat16, channels_last-contiguous (`residual` the same), of fewer than
/// 2^31 - 1 elements and at most 880801 images (ATen's limits for cuDNN's
/// BatchNorm), training mode,
/// float weight and bias of C elements (network_to_half keeps BatchNorm in
/// FP32), float running statistics (or none), and a configuration that
/// cuDNN has not refused before in this process. `residual` may be
/// undefined (batch_norm_relu).
std::string batch_norm_relu_fallback_reason(const torch::Tensor& input,
                                            const torch::Tensor& residual,
                                            const torch::Tensor& weight,
                                            const torch::Tensor& bias,
                                            const torch::Tensor& running_mean,
                                            const torch::Tensor& running_var,
                                            bool training);

/// Whether this lamp can fuse at all: built against a CUDA LibTorch with
/// cuDNN headers, and cuDNN's library loaded. When it cannot, `why` (if
/// given) says why.
bool batch_norm_relu_fusion_built(std::string* why = nullptr);

namespace detail {

/// While one exists, the fused path runs ATen's reference kernels instead of
/// cuDNN's, on any device and for any floating dtype and memory format (the
/// other conditions of batch_norm_relu_fallback_reason() still apply). For
/// tests of the fused path's autograd and running statistics on machines
/// without a GPU. Not thread-safe: create it before the threads that use it.
class ScopedReferenceKernels {
 public:
  /// Routes the fused path through the reference kernels.
  ScopedReferenceKernels();
  /// Restores the previous routing.
  ~ScopedReferenceKernels();
  ScopedReferenceKernels(const ScopedReferenceKernels&) = delete;
  ScopedReferenceKernels& operator=(const ScopedReferenceKernels&) = delete;

 private:
  bool previous_;
};

/// The tensors the fused path keeps for backward, read from
/// `output.grad_fn()` (for tests and memory accounting): input, residual
/// (undefined for batch_norm_relu), weight, bias, output, the batch mean,
/// the batch inverse standard deviation and the kernel's reserve space.
/// Empty when `output` does not come from the fused path with autograd
/// recording.
std::vector<torch::Tensor> batch_norm_relu_saved_tensors(
    const torch::Tensor& output);

} // namespace detail

} // namespace ops
} // namespace lamp
