// The checks of FP8: CUDA's rules for _scaled_mm's operands, whether FP8
// can run on a device, and the dtypes FP8 layers take.
#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <sstream>
#include <string>

#include "lamp/platform/hardware.h"
#include "nn/float8_internal.h"
#include "platform/compat.h"

namespace lamp {
namespace nn {
namespace internal {

bool is_low_precision(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

} // namespace internal

namespace detail {

void check_scaled_mm_operands(const torch::Tensor& a, const torch::Tensor& b,
                              const std::string& layer,
                              const std::string& product) {
  const auto where = [&] {
    return "lamp::nn::float8_linear: layer '" + layer + "', " + product + ": ";
  };
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, where(),
              "both operands must be matrices, got ", a.sizes(), " and ",
              b.sizes(), ".");
  TORCH_CHECK(a.size(1) == b.size(0), where(), "the shapes ", a.sizes(),
              " and ", b.sizes(), " do not multiply.");
#if LAMP_TORCH_FLOAT8
  const auto is_fp8 = [](const torch::Tensor& t) {
    return t.scalar_type() == c10::ScalarType::Float8_e4m3fn ||
           t.scalar_type() == c10::ScalarType::Float8_e5m2;
  };
  TORCH_CHECK(is_fp8(a) && is_fp8(b), where(),
              "both operands must be E4M3 or E5M2, got ", a.scalar_type(),
              " and ", b.scalar_type(), ".");
  TORCH_CHECK(!(a.scalar_type() == c10::ScalarType::Float8_e5m2 &&
                b.scalar_type() == c10::ScalarType::Float8_e5m2),
              where(),
              "E5M2 x E5M2 is not a product CUDA's _scaled_mm runs; one "
              "operand must be E4M3.");
#endif
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(m % 16 == 0 && k % 16 == 0 && n % 16 == 0, where(),
              "CUDA's _scaled_mm needs every dimension a multiple of 16, got [",
              m, ", ", k, "] x [", k, ", ", n,
              "]; keep this layer out of convert_to_float8 (its predicate) or "
              "give it sizes that are multiples of 16.");
  TORCH_CHECK(a.stride(1) == 1 && a.stride(0) == k, where(),
              "the first operand must be row-major, got strides ", a.strides(),
              " for ", a.sizes(), ".");
  TORCH_CHECK(b.stride(0) == 1 && b.stride(1) == k, where(),
              "the second operand must be column-major, got strides ",
              b.strides(), " for ", b.sizes(), ".");
}

} // namespace detail

std::string float8_unavailable_reason(const torch::Device& device) {
#if !LAMP_TORCH_FLOAT8
  (void)device;
  return "this LibTorch (" TORCH_VERSION
         ") has no float8 types or _scaled_mm; FP8 training needs LibTorch "
         "2.5 or newer (the torch wheel's)";
#else
  if (device.is_cuda()) {
    const auto gpu = device_capabilities(device);
    if (gpu.sm() < 89) {
      std::ostringstream s;
      s << device << " (" << gpu.name << ") has compute capability "
        << gpu.compute_major << "." << gpu.compute_minor
        << "; FP8 matrix products need 8.9 (Ada) or newer (Hopper, "
           "Blackwell)";
      return s.str();
    }
    return "";
  }
  TORCH_CHECK(device.is_cpu(), "lamp::nn::float8: device ", device,
              " is not supported; use a CPU or a CUDA device.");
  // The CPU _scaled_mm (an emulation, for testing) came after the float8
  // types; asked once per process.
  static const std::string cpu_reason = [] {
    try {
      const auto a = torch::zeros({16, 16}).to(c10::ScalarType::Float8_e4m3fn);
      const auto one = torch::ones({});
      at::_scaled_mm(a, a.t(), one, one, c10::nullopt, c10::nullopt,
                     torch::kFloat);
      return std::string();
    } catch (const c10::Error&) {
      return std::string("this LibTorch (" TORCH_VERSION
                         ") has no CPU _scaled_mm to emulate FP8 products "
                         "with; use a CUDA GPU of compute capability 8.9 or "
                         "newer, or a newer LibTorch");
    }
  }();
  return cpu_reason;
#endif
}

} // namespace nn
} // namespace lamp
