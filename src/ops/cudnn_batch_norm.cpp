// Built only when the LibTorch found has CUDA and cuDNN's headers were found
// (CMakeLists.txt): cuDNN's fused BatchNorm + ReLU (+ add) training kernels.
//
// The functions come from the libcudnn LibTorch loaded (dlopen with
// RTLD_NOLOAD finds it by its soname), so that lamp links nothing of cuDNN:
// the same library, whatever folder the torch wheel or LibTorch keeps it in.
// The cuDNN handle is ATen's (one per device and thread), on the current
// stream, so the kernels order with the convolutions around them and are
// captured by CUDA graphs like ATen's own.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>

#include <algorithm>
#include <string>

#include "ops/cudnn_batch_norm.h"
#include "platform/loaded_library.h"

namespace lamp {
namespace detail {
namespace {

constexpr const char* kCudnnBatchNormWho = "lamp::ops::batch_norm_relu";

// The cuDNN functions used here, resolved once.
struct Cudnn {
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_tensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_tensor_4d = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_tensor = nullptr;
  decltype(&cudnnDeriveBNTensorDescriptor) derive_bn = nullptr;
  decltype(&cudnnCreateActivationDescriptor) create_activation = nullptr;
  decltype(&cudnnSetActivationDescriptor) set_activation = nullptr;
  decltype(&cudnnDestroyActivationDescriptor) destroy_activation = nullptr;
  decltype(&cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize)
      forward_workspace = nullptr;
  decltype(&cudnnGetBatchNormalizationTrainingExReserveSpaceSize) reserve_size =
      nullptr;
  decltype(&cudnnGetBatchNormalizationBackwardExWorkspaceSize)
      backward_workspace = nullptr;
  decltype(&cudnnBatchNormalizationForwardTrainingEx) forward = nullptr;
  decltype(&cudnnBatchNormalizationBackwardEx) backward = nullptr;
  // Why the functions cannot be used; "" when they all resolved.
  std::string unavailable;
};

const Cudnn& cudnn() {
  static const Cudnn api = [] {
    Cudnn a;
    const std::string soname = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
    void* library = loaded_library(soname);
    if (library == nullptr) {
      a.unavailable = not_loaded_reason(soname, "cuDNN", CUDNN_MAJOR) + ".";
      return a;
    }
    const auto need = [&](const char* symbol, auto& function) {
      resolve_symbol(library, symbol, function, "cuDNN", a.unavailable);
    };
    need("cudnnGetErrorString", a.error_string);
    need("cudnnSetStream", a.set_stream);
    need("cudnnCreateTensorDescriptor", a.create_tensor);
    need("cudnnSetTensor4dDescriptor", a.set_tensor_4d);
    need("cudnnDestroyTensorDescriptor", a.destroy_tensor);
    need("cudnnDeriveBNTensorDescriptor", a.derive_bn);
    need("cudnnCreateActivationDescriptor", a.create_activation);
    need("cudnnSetActivationDescriptor", a.set_activation);
    need("cudnnDestroyActivationDescriptor", a.destroy_activation);
    need("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
         a.forward_workspace);
    need("cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
         a.reserve_size);
    need("cudnnGetBatchNormalizationBackwardExWorkspaceSize",
         a.backward_workspace);
    need("cudnnBatchNormalizationForwardTrainingEx", a.forward);
    need("cudnnBatchNormalizationBackwardEx", a.backward);
    if (!a.unavailable.empty()) {
      a.unavailable += ".";
    }
    return a;
  }();
  return api;
}

void check(cudnnStatus_t status, const char* call) {
  TORCH_CHECK(status == CUDNN_STATUS_SUCCESS, kCudnnBatchNormWho, ": ", call,
              " failed: ", cudnn().error_string(status),
              ". To run the stock ops, turn the fusion off: ", kFusionOffAdvice,
              ".");
}

// A cuDNN descriptor, destroyed with its scope.
template <typename T, typename Destroy>
class Descriptor {
 public:
  template <typename Create>
  Descriptor(Create create, Destroy destroy, const char* what)
      : destroy_(destroy) {
    check(create(&desc_), what);
  }
  ~Descriptor() {
    if (desc_ != nullptr) {
      destroy_(desc_);
    }
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
  Destroy destroy_;
};

using TensorDescriptor =
    Descriptor<cudnnTensorDescriptor_t, decltype(Cudnn::destroy_tensor)>;
using ActivationDescriptor = Descriptor<cudnnActivationDescriptor_t,
                                        decltype(Cudnn::destroy_activation)>;

// The activation tensors' descriptor (NHWC, x's dtype) and the derived one
// of the per-channel float tensors.
struct Descriptors {
  TensorDescriptor data{cudnn().create_tensor, cudnn().destroy_tensor,
                        "cudnnCreateTensorDescriptor"};
  TensorDescriptor channel{cudnn().create_tensor, cudnn().destroy_tensor,
                           "cudnnCreateTensorDescriptor"};
  ActivationDescriptor relu{cudnn().create_activation,
                            cudnn().destroy_activation,
                            "cudnnCreateActivationDescriptor"};

  explicit Descriptors(const torch::Tensor& x) {
    // NaN propagates, as torch::relu's does: an overflow in the forward
    // must reach the loss (and the GradScaler), not be zeroed here.
    check(cudnn().set_activation(relu.get(), CUDNN_ACTIVATION_RELU,
                                 CUDNN_PROPAGATE_NAN, 0.0),
          "cudnnSetActivationDescriptor");
    const auto type =
        x.scalar_type() == torch::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    check(cudnn().set_tensor_4d(
              data.get(), CUDNN_TENSOR_NHWC, type, static_cast<int>(x.size(0)),
              static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
              static_cast<int>(x.size(3))),
          "cudnnSetTensor4dDescriptor");
    check(cudnn().derive_bn(channel.get(), data.get(), kMode),
          "cudnnDeriveBNTensorDescriptor");
  }

  // cuDNN's persistent spatial mode: the one its fused BatchNorm ops take,
  // and the one ATen's cuDNN BatchNorm trains with.
  static constexpr cudnnBatchNormMode_t kMode =
      CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
};

cudnnHandle_t handle_on_current_stream() {
  auto handle = at::native::getCudnnHandle();
  check(cudnn().set_stream(handle, at::cuda::getCurrentCUDAStream()),
        "cudnnSetStream");
  return handle;
}

cudnnBatchNormOps_t ops_for(bool residual) {
  return residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                  : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
}

void* data_or_null(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

// At least one byte: cuDNN gets a valid pointer even for a zero size.
torch::Tensor bytes(size_t size, const torch::Tensor& like) {
  return torch::empty({static_cast<int64_t>(std::max<size_t>(size, 1))},
                      like.options().dtype(torch::kByte));
}

std::string unsupported(const char* call) {
  return std::string(call) + " returned CUDNN_STATUS_NOT_SUPPORTED.";
}

} // namespace

std::string cudnn_batch_norm_unavailable_reason() {
  return cudnn().unavailable;
}

bool cudnn_batch_norm_activation_forward(
    const torch::Tensor& x, const torch::Tensor& z, const torch::Tensor& weight,
    const torch::Tensor& bias, const torch::Tensor& running_mean,
    const torch::Tensor& running_var, double factor, double eps,
    FusedBatchNormForward& result, std::string& why) {
  TORCH_INTERNAL_ASSERT(cudnn().unavailable.empty());
  c10::cuda::CUDAGuard guard(x.device());
  const auto handle = handle_on_current_stream();
  const Descriptors d(x);
  const auto ops = ops_for(z.defined());
  const auto z_desc = z.defined() ? d.data.get() : nullptr;

  size_t workspace_size = 0;
  auto status = cudnn().forward_workspace(
      handle, Descriptors::kMode, ops, d.data.get(), z_desc, d.data.get(),
      d.channel.get(), d.relu.get(), &workspace_size);
  if (status == CUDNN_STATUS_NOT_SUPPORTED) {
    why =
        unsupported("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
    return false;
  }
  check(status, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
  size_t reserve_size = 0;
  status = cudnn().reserve_size(handle, Descriptors::kMode, ops, d.relu.get(),
                                d.data.get(), &reserve_size);
  if (status == CUDNN_STATUS_NOT_SUPPORTED) {
    why = unsupported("cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
    return false;
  }
  check(status, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize");

  const auto workspace = bytes(workspace_size, x);
  result.reserve = bytes(reserve_size, x);
  result.reserve_size = static_cast<int64_t>(reserve_size);
  result.output = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
  result.save_mean = torch::empty({x.size(1)}, weight.options());
  result.save_invstd = torch::empty({x.size(1)}, weight.options());
  // Scaling factors are float for half and bfloat16 data.
  const float one = 1.0f, zero = 0.0f;
  status = cudnn().forward(
      handle, Descriptors::kMode, ops, &one, &zero, d.data.get(), x.data_ptr(),
      z_desc, data_or_null(z), d.data.get(), result.output.data_ptr(),
      d.channel.get(), weight.data_ptr(), bias.data_ptr(), factor,
      data_or_null(running_mean), data_or_null(running_var), eps,
      result.save_mean.data_ptr(), result.save_invstd.data_ptr(), d.relu.get(),
      data_or_null(workspace), workspace_size, data_or_null(result.reserve),
      reserve_size);
  if (status == CUDNN_STATUS_NOT_SUPPORTED) {
    why = unsupported("cudnnBatchNormalizationForwardTrainingEx");
    return false;
  }
  check(status, "cudnnBatchNormalizationForwardTrainingEx");
  return true;
}

FusedBatchNormBackward cudnn_batch_norm_activation_backward(
    const torch::Tensor& grad_output, const torch::Tensor& x, bool has_residual,
    const torch::Tensor& weight, const torch::Tensor& bias,
    const FusedBatchNormForward& saved, double eps) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto handle = handle_on_current_stream();
  const Descriptors d(x);
  const auto ops = ops_for(has_residual);
  const auto grad = grad_output.to(x.scalar_type())
                        .contiguous(at::MemoryFormat::ChannelsLast);
  FusedBatchNormBackward result;
  result.input = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
  if (has_residual) {
    result.residual = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
  }
  result.weight = torch::empty_like(weight);
  result.bias = torch::empty_like(bias);
  const auto dz_desc = has_residual ? d.data.get() : nullptr;

  size_t workspace_size = 0;
  check(cudnn().backward_workspace(handle, Descriptors::kMode, ops,
                                   d.data.get(), d.data.get(), d.data.get(),
                                   dz_desc, d.data.get(), d.channel.get(),
                                   d.relu.get(), &workspace_size),
        "cudnnGetBatchNormalizationBackwardExWorkspaceSize");
  const auto workspace = bytes(workspace_size, x);
  const float one = 1.0f, zero = 0.0f;
  check(
      cudnn().backward(
          handle, Descriptors::kMode, ops, &one, &zero, &one, &zero,
          d.data.get(), x.data_ptr(), d.data.get(), saved.output.data_ptr(),
          d.data.get(), grad.data_ptr(), dz_desc, data_or_null(result.residual),
          d.data.get(), result.input.data_ptr(), d.channel.get(),
          weight.data_ptr(), bias.data_ptr(), result.weight.data_ptr(),
          result.bias.data_ptr(), eps, saved.save_mean.data_ptr(),
          saved.save_invstd.data_ptr(), d.relu.get(), data_or_null(workspace),
          workspace_size, data_or_null(saved.reserve),
          static_cast<size_t>(saved.reserve_size)),
      "cudnnBatchNormalizationBackwardEx");
  return result;
}

} // namespace detail
} // namespace lamp
