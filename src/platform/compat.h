// The one place where lamp branches on the LibTorch version. Everything else
// calls these functions and constants.
//
// LibTorch 1.13 has per-device autocast functions (is_enabled/set_enabled for
// CUDA, is_cpu_enabled/set_cpu_enabled for CPU,
// get/set_autocast_{gpu,cpu}_dtype). LibTorch 2.4 replaced them with
// device-generic ones taking a DeviceType; the old names still compile there
// but warn.
//
// No #pragma once: the file is read again by a source that asks for one of
// its optional parts (LAMP_COMPAT_C10D, LAMP_COMPAT_PROFILER) after an
// earlier include without it, as a unity build's combined sources do. Each
// part has its own guard.

#ifndef LAMP_PLATFORM_COMPAT_H
#define LAMP_PLATFORM_COMPAT_H

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define LAMP_TORCH_DEVICE_GENERIC_AUTOCAST 1
#else
#define LAMP_TORCH_DEVICE_GENERIC_AUTOCAST 0
#endif

// at::cpu::get_cpu_capabilities (cpuinfo's CPU flags), in LibTorch 2.11.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
#define LAMP_TORCH_CPU_CAPABILITIES 1
#include <ATen/cpu/Utils.h>
#else
#define LAMP_TORCH_CPU_CAPABILITIES 0
#endif

// ATen's CPU LayerNorm and GroupNorm take BF16/FP16 inputs with FP32
// parameters (the mixed-dtype kernels CPU autocast relies on) from
// LibTorch 2.0; 1.13 has none, so lamp's Autocast runs those norms in FP32
// itself there (src/amp/autocast_norms.cpp).
#if TORCH_VERSION_MAJOR >= 2
#define LAMP_TORCH_CPU_MIXED_DTYPE_NORMS 1
#else
#define LAMP_TORCH_CPU_MIXED_DTYPE_NORMS 0
#endif

// Float8 dtypes (E4M3, E5M2) and at::_scaled_mm returning one tensor (2.5
// on; 2.1 to 2.3 returned the output with an amax). lamp's FP8 layers
// (src/nn/float8_*.cpp) need both; 1.13 has neither.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define LAMP_TORCH_FLOAT8 1
#else
#define LAMP_TORCH_FLOAT8 0
#endif

// at::_foreach_copy_ (a list of tensors copied into another, dtypes
// converted; on CUDA one multi-tensor kernel where each list shares a dtype,
// device and the other's shapes), from LibTorch 2.1; 1.13 has none.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define LAMP_TORCH_FOREACH_COPY 1
#else
#define LAMP_TORCH_FOREACH_COPY 0
#endif

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace lamp {
namespace detail {

/// The alternative T of a module option's variant (a Conv2d's padding, its
/// padding mode), or nullptr: c10::variant in LibTorch 1.x, std::variant in
/// 2.x.
template <typename T, typename Variant>
const T* variant_get_if(const Variant& value) {
#if TORCH_VERSION_MAJOR >= 2
  return std::get_if<T>(&value);
#else
  return c10::get_if<T>(&value);
#endif
}

/// CPU autocast accepts FP16 (LibTorch 1.13 only knows BF16 there).
constexpr bool kCpuAutocastSupportsHalf = LAMP_TORCH_DEVICE_GENERIC_AUTOCAST;

/// ATen has CPU kernels for _amp_foreach_non_finite_check_and_unscale_ and
/// _amp_update_scale_ (1.13 has them for CUDA only).
constexpr bool kCpuAmpKernels = LAMP_TORCH_DEVICE_GENERIC_AUTOCAST;

inline void check_autocast_device(c10::DeviceType device_type) {
  TORCH_CHECK(device_type == c10::DeviceType::CPU ||
                  device_type == c10::DeviceType::CUDA,
              "lamp::Autocast: device type ", device_type,
              " is not supported; use torch::kCPU or torch::kCUDA.");
}

inline bool autocast_enabled(c10::DeviceType device_type) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                             : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device_type) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CPU
             ? at::autocast::get_autocast_cpu_dtype()
             : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type,
                               at::ScalarType dtype) {
  check_autocast_device(device_type);
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// ------------------------------------------------------------ autograd nodes
//
// LibTorch 1.x holds a graph's nodes in std::shared_ptr and frees them
// through torch::autograd::deleteNode (iteratively, so that a long graph
// does not recurse deeply); 2.x dropped deleteNode, and the newest 2.x
// (2.15) hold nodes in c10::intrusive_ptr. Told apart by the type itself.

/// A custom autograd node, held as this LibTorch holds its own nodes.
template <typename NodeType, typename... Args>
auto make_autograd_node(Args&&... args) {
  if constexpr (std::is_base_of<c10::intrusive_ptr_target,
                                torch::autograd::Node>::value) {
    return c10::make_intrusive<NodeType>(std::forward<Args>(args)...);
  } else {
#if TORCH_VERSION_MAJOR < 2
    return std::shared_ptr<NodeType>(new NodeType(std::forward<Args>(args)...),
                                     torch::autograd::deleteNode);
#else
    return std::make_shared<NodeType>(std::forward<Args>(args)...);
#endif
  }
}

// ---------------------------------------------------------------- optimizers
//
// ATen's fused optimizer kernels (_fused_sgd_, _fused_adam_, _fused_adamw_),
// with grad_scale/found_inf and a tensor learning rate, exist for CUDA and
// CPU from LibTorch 2.4 on (1.13 has only a CUDA _fused_adam_, without
// AdamW, SGD or a tensor lr): lamp uses them from 2.4 on and its foreach or
// per-tensor paths before.

/// _fused_sgd_ / _fused_adam_ / _fused_adamw_ on CPU and CUDA.
constexpr bool kFusedOptimizers = LAMP_TORCH_DEVICE_GENERIC_AUTOCAST;

/// The key of a parameter in torch::optim::Optimizer::state(): a string of
/// the TensorImpl's address in 1.13, the address itself from 2.0 on.
#if TORCH_VERSION_MAJOR >= 2
inline void* optimizer_state_key(const at::Tensor& param) {
  return param.unsafeGetTensorImpl();
}
#else
inline std::string optimizer_state_key(const at::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}
#endif

// ------------------------------------------------------------------ autograd
//
// A strong reference to an autograd node (a parameter's gradient
// accumulator, a tensor's grad_fn): std::shared_ptr<Node> up to LibTorch
// 2.14, c10::intrusive_ptr<Node> from 2.15 on (PyTorch PRs 181139/181782).
// Taken from the function's own return type, so it follows whatever the
// version returns.
using AutogradNodePtr = decltype(torch::autograd::impl::grad_accumulator(
    std::declval<const at::Tensor&>()));

/// An undefined tensor as nullopt: the fused kernels' optional arguments.
inline c10::optional<at::Tensor> optional_tensor(const at::Tensor& tensor) {
  return tensor.defined() ? c10::optional<at::Tensor>(tensor) : c10::nullopt;
}

/// Initialises CUDA once per process, as Python's torch.cuda._lazy_init()
/// does before its memory statistics: the CUDA caching allocator only knows
/// the devices after this (LibTorch 2.x refuses the statistics of a device
/// it does not know with "Invalid device argument"). The first CUDA tensor
/// does the same; nothing happens on a second call. LibTorch 2.6 renamed
/// lazyInitCUDA() to lazyInitDevice(kCUDA) (the old name warns).
inline void lazy_init_cuda() {
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}

inline void fused_sgd_(at::TensorList params, at::TensorList grads,
                       at::TensorList momentum_buffers, double weight_decay,
                       double momentum, double lr, const at::Tensor& lr_tensor,
                       double dampening, bool nesterov, bool is_first_step,
                       const at::Tensor& grad_scale,
                       const at::Tensor& found_inf) {
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  const auto scale = optional_tensor(grad_scale);
  const auto inf = optional_tensor(found_inf);
  if (lr_tensor.defined()) {
    at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum,
                    lr_tensor, dampening, nesterov, /*maximize=*/false,
                    is_first_step, scale, inf);
  } else {
    at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr,
                    dampening, nesterov, /*maximize=*/false, is_first_step,
                    scale, inf);
  }
#else
  (void)params, (void)grads, (void)momentum_buffers, (void)weight_decay,
      (void)momentum, (void)lr, (void)lr_tensor, (void)dampening,
      (void)nesterov, (void)is_first_step, (void)grad_scale, (void)found_inf;
  TORCH_INTERNAL_ASSERT(false, "fused SGD needs LibTorch >= 2.4");
#endif
}

/// _fused_adam_ (decoupled_weight_decay false) or _fused_adamw_ (true).
inline void fused_adam_(bool decoupled_weight_decay, at::TensorList params,
                        at::TensorList grads, at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs,
                        at::TensorList max_exp_avg_sqs,
                        at::TensorList state_steps, double lr,
                        const at::Tensor& lr_tensor, double beta1, double beta2,
                        double weight_decay, double eps, bool amsgrad,
                        const at::Tensor& grad_scale,
                        const at::Tensor& found_inf) {
#if LAMP_TORCH_DEVICE_GENERIC_AUTOCAST
  const auto scale = optional_tensor(grad_scale);
  const auto inf = optional_tensor(found_inf);
  const auto call = [&](const auto& learning_rate) {
    if (decoupled_weight_decay) {
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                        state_steps, learning_rate, beta1, beta2, weight_decay,
                        eps, amsgrad, /*maximize=*/false, scale, inf);
    } else {
      at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                       state_steps, learning_rate, beta1, beta2, weight_decay,
                       eps, amsgrad, /*maximize=*/false, scale, inf);
    }
  };
  if (lr_tensor.defined()) {
    call(lr_tensor);
  } else {
    call(lr);
  }
#else
  (void)decoupled_weight_decay, (void)params, (void)grads, (void)exp_avgs,
      (void)exp_avg_sqs, (void)max_exp_avg_sqs, (void)state_steps, (void)lr,
      (void)lr_tensor, (void)beta1, (void)beta2, (void)weight_decay, (void)eps,
      (void)amsgrad, (void)grad_scale, (void)found_inf;
  TORCH_INTERNAL_ASSERT(false, "fused Adam needs LibTorch >= 2.4");
#endif
}

/// dst[i].copy_(src[i]) for every i: one at::_foreach_copy_ where this
/// LibTorch has it (one multi-tensor kernel a list on CUDA), a copy_ each
/// on 1.13. The same bits either way (a conversion rounds as copy_ does).
inline void foreach_copy_(at::TensorList dst, at::TensorList src) {
#if LAMP_TORCH_FOREACH_COPY
  at::_foreach_copy_(dst, src);
#else
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i].copy_(src[i]);
  }
#endif
}

/// LibTorch's own CPU feature query (at::cpu::get_cpu_capabilities, from
/// cpuinfo; LibTorch 2.11 has it, 1.13 does not): each flag in `names`, or
/// false where the query has no such key. Returns false, filling nothing,
/// where this LibTorch has no query (the caller reads CPUID instead).
inline bool libtorch_cpu_flags(const std::vector<std::string>& names,
                               std::vector<bool>& flags) {
#if LAMP_TORCH_CPU_CAPABILITIES
  const auto capabilities = at::cpu::get_cpu_capabilities();
  flags.clear();
  for (const auto& name : names) {
    const auto found = capabilities.find(name);
    flags.push_back(found != capabilities.end() && found->second.isBool() &&
                    found->second.toBool());
  }
  return true;
#else
  (void)names, (void)flags;
  return false;
#endif
}

/// c10's warning handler: c10::Warning::{get,set}_warning_handler and
/// process(SourceLocation, msg, verbatim) in LibTorch 1.13;
/// c10::WarningUtils:: and process(const c10::Warning&) from 2.0.
#if TORCH_VERSION_MAJOR >= 2
namespace warning_api = c10::WarningUtils;
#else
namespace warning_api = c10::Warning;
#endif

inline c10::WarningHandler* warning_handler() {
  return warning_api::get_warning_handler();
}

inline void set_warning_handler(c10::WarningHandler* handler) {
  warning_api::set_warning_handler(handler);
}

/// A handler that hands each warning's message to `sink`.
inline std::unique_ptr<c10::WarningHandler> make_warning_handler(
    std::function<void(const std::string&)> sink) {
  class Handler : public c10::WarningHandler {
   public:
    explicit Handler(std::function<void(const std::string&)> sink)
        : sink_(std::move(sink)) {}
#if TORCH_VERSION_MAJOR >= 2
    void process(const c10::Warning& warning) override {
      sink_(warning.msg());
    }
#else
    void process(const c10::SourceLocation&, const std::string& msg,
                 const bool) override {
      sink_(msg);
    }
#endif

   private:
    std::function<void(const std::string&)> sink_;
  };
  return std::make_unique<Handler>(std::move(sink));
}

/// LibTorch's global switches of scaled_dot_product_attention's backends
/// (at::globalContext().userEnabled*SDP / setSDPUse*): 0 flash, 1
/// memory-efficient, 2 cuDNN, 3 math. LibTorch 1.13 has no fused attention:
/// only math exists there, always on. cuDNN's switch exists from 2.3.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define LAMP_TORCH_SDP_CUDNN 1
#else
#define LAMP_TORCH_SDP_CUDNN 0
#endif

inline bool sdp_backend_exists(int backend) {
#if TORCH_VERSION_MAJOR >= 2
  return backend != 2 || LAMP_TORCH_SDP_CUDNN;
#else
  return backend == 3;
#endif
}

inline bool sdp_backend_enabled(int backend) {
#if TORCH_VERSION_MAJOR >= 2
  auto& context = at::globalContext();
  switch (backend) {
    case 0:
      return context.userEnabledFlashSDP();
    case 1:
      return context.userEnabledMemEfficientSDP();
#if LAMP_TORCH_SDP_CUDNN
    case 2:
      return context.userEnabledCuDNNSDP();
#endif
    case 3:
      return context.userEnabledMathSDP();
    default:
      return false;
  }
#else
  return backend == 3;
#endif
}

inline void set_sdp_backend_enabled(int backend, bool enabled) {
#if TORCH_VERSION_MAJOR >= 2
  auto& context = at::globalContext();
  switch (backend) {
    case 0:
      context.setSDPUseFlash(enabled);
      return;
    case 1:
      context.setSDPUseMemEfficient(enabled);
      return;
#if LAMP_TORCH_SDP_CUDNN
    case 2:
      context.setSDPUseCuDNN(enabled);
      return;
#endif
    case 3:
      context.setSDPUseMath(enabled);
      return;
    default:
      return;
  }
#else
  (void)backend;
  (void)enabled;
#endif
}

/// ATen's fused scaled_dot_product_attention (LibTorch 2.0 on), or nothing:
/// `available` false in 1.13, whose callers compute attention with the math
/// formula themselves.
struct FusedAttention {
#if TORCH_VERSION_MAJOR >= 2
  static constexpr bool available = true;
  static at::Tensor run(const at::Tensor& query, const at::Tensor& key,
                        const at::Tensor& value,
                        const c10::optional<at::Tensor>& mask, double dropout_p,
                        bool is_causal) {
    return at::scaled_dot_product_attention(query, key, value, mask, dropout_p,
                                            is_causal);
  }
#else
  static constexpr bool available = false;
  static at::Tensor run(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const c10::optional<at::Tensor>&, double, bool) {
    TORCH_INTERNAL_ASSERT(false, "no fused attention in LibTorch 1.x");
  }
#endif
};

} // namespace detail
} // namespace lamp

#endif // LAMP_PLATFORM_COMPAT_H

// c10d's backends are ProcessGroup subclasses in LibTorch 1.13 and Backend
// subclasses (under a ProcessGroup front) from 2.0; both have the allreduce /
// broadcast calls lamp uses. Only the distributed sources ask for this part.
#if defined(LAMP_COMPAT_C10D) && !defined(LAMP_PLATFORM_COMPAT_C10D_H)
#define LAMP_PLATFORM_COMPAT_C10D_H
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace lamp {
namespace detail {
using C10dBackend = c10d::Backend;
} // namespace detail
} // namespace lamp
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace lamp {
namespace detail {
using C10dBackend = c10d::ProcessGroup;
} // namespace detail
} // namespace lamp
#endif
#endif // LAMP_COMPAT_C10D

// ------------------------------------------------------------------ profiler
//
// The times of the Kineto profiler's events (torch::autograd::profiler::
// KinetoEvent): startUs()/durationUs(), microseconds, in LibTorch 1.13 and
// 2.0; startNs()/durationNs(), nanoseconds, from 2.1 (1.13 and 2.11 are the
// versions lamp builds against). Which events are the GPU's own work:
// Kineto's activity type where LibTorch ships Kineto's headers (the torch
// wheel does; Debian's 1.13 has no Kineto, and no GPU), since Kineto also
// puts annotations and syncs on the GPU's timeline. Only lamp_bench's
// profiler asks for this part.
#if defined(LAMP_COMPAT_PROFILER) && !defined(LAMP_PLATFORM_COMPAT_PROFILER_H)
#define LAMP_PLATFORM_COMPAT_PROFILER_H
#include <torch/csrc/autograd/profiler_kineto.h>
#if __has_include(<kineto/ActivityType.h>)
#include <kineto/ActivityType.h>
#define LAMP_KINETO_ACTIVITY_TYPES 1
#else
#define LAMP_KINETO_ACTIVITY_TYPES 0
#endif
namespace lamp {
namespace detail {

/// A kernel, memcpy or memset that ran on the device.
inline bool profiler_device_work(
    const torch::autograd::profiler::KinetoEvent& event) {
#if LAMP_KINETO_ACTIVITY_TYPES
  using libkineto::ActivityType;
  const auto type = static_cast<ActivityType>(event.activityType());
  return type == ActivityType::CONCURRENT_KERNEL ||
         type == ActivityType::GPU_MEMCPY || type == ActivityType::GPU_MEMSET;
#else
  return event.deviceType() != c10::DeviceType::CPU;
#endif
}

#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
inline int64_t profiler_start_ns(
    const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.startNs());
}
inline int64_t profiler_duration_ns(
    const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.durationNs());
}
#else
inline int64_t profiler_start_ns(
    const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.startUs()) * 1000;
}
inline int64_t profiler_duration_ns(
    const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.durationUs()) * 1000;
}
#endif
} // namespace detail
} // namespace lamp
#endif // LAMP_COMPAT_PROFILER
