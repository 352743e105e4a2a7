// CPU autocast's FP32 policy for LayerNorm and GroupNorm where LibTorch has
// no mixed-dtype CPU kernels (1.13): under autocast a Linear hands a norm
// BF16 activations while the norm's parameters stay FP32, and 1.13's CPU
// kernels refuse that pair ("expected scalar type BFloat16 but found
// Float"). What autocast's FP32 list does for these ops on CUDA, and what
// the mixed-dtype kernels of LibTorch 2.x do in effect, is done here: the
// input and parameters are cast to FP32, the norm runs there, and its FP32
// output goes on to the next op, which autocast casts as it needs. The
// kernels are registered for the AutocastCPU key, once, the first time a
// CPU autocast guard is entered, and only where ATen has none of its own.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <mutex>

#include "amp/autocast_norms.h"
#include "platform/compat.h"

namespace lamp {
namespace detail {

#if LAMP_TORCH_CPU_MIXED_DTYPE_NORMS

void ensure_cpu_autocast_norms() {}

#else

namespace {

// A 16-bit floating tensor as FP32; anything else as it is.
at::Tensor in_fp32(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kBFloat16 ||
                         t.scalar_type() == at::kHalf)
             ? t.to(at::kFloat)
             : t;
}

c10::optional<at::Tensor> in_fp32(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? c10::optional<at::Tensor>(in_fp32(*t)) : t;
}

at::Tensor layer_norm_in_fp32(const at::Tensor& input,
                              at::IntArrayRef normalized_shape,
                              const c10::optional<at::Tensor>& weight,
                              const c10::optional<at::Tensor>& bias, double eps,
                              bool cudnn_enable) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return at::layer_norm(in_fp32(input), normalized_shape, in_fp32(weight),
                        in_fp32(bias), eps, cudnn_enable);
}

at::Tensor group_norm_in_fp32(const at::Tensor& input, int64_t num_groups,
                              const c10::optional<at::Tensor>& weight,
                              const c10::optional<at::Tensor>& bias, double eps,
                              bool cudnn_enabled) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return at::group_norm(in_fp32(input), num_groups, in_fp32(weight),
                        in_fp32(bias), eps, cudnn_enabled);
}

bool has_autocast_cpu_kernel(const char* op) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(op, "")
      .hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU);
}

} // namespace

void ensure_cpu_autocast_norms() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (has_autocast_cpu_kernel("aten::layer_norm") ||
        has_autocast_cpu_kernel("aten::group_norm")) {
      return; // this LibTorch's autocast handles them itself
    }
    // Kept for the life of the process, as a static registration would be.
    auto* library =
        new torch::Library(torch::Library::IMPL, "aten",
                           c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    library->impl("layer_norm", TORCH_FN(layer_norm_in_fp32));
    library->impl("group_norm", TORCH_FN(group_norm_in_fp32));
  });
}

#endif

} // namespace detail
} // namespace lamp
