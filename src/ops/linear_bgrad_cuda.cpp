// The weight gradient of y = x w^T + b with the bias gradient in its
// epilogue. Column-major (ops/cublaslt.h): d_weight [out, in] is an in x out
// matrix, x^T g: A = x (stored in x rows, ld in, not transposed), B = g
// (stored out x rows, ld out) read transposed, k = rows. BGRADB sums
// op(B) over k, one sum per column of D: g's column sums, the bias
// gradient. Apex's fused_dense and Transformer Engine's wgrad do the same.
#include "ops/linear_bgrad_cuda.h"

#include <c10/cuda/CUDAGuard.h>

#include <limits>
#include <string>

#include "ops/cublaslt.h"

namespace lamp {
namespace detail {

std::string linear_bgrad_unavailable_reason(at::ScalarType dtype, int64_t rows,
                                            int64_t in, int64_t out) {
  if (!cublaslt_unavailable_reason().empty()) {
    return cublaslt_unavailable_reason();
  }
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return std::string(
               "the epilogue takes FP16 and BF16 (autocast's dtypes), "
               "not ") +
           c10::toString(dtype);
  }
  if (out == 0) {
    return "the weight has no rows (out 0): no product to run";
  }
  if (in % 8 != 0 || out % 8 != 0) {
    return "the epilogue wants the widths to be multiples of 8, got in " +
           std::to_string(in) + ", out " + std::to_string(out);
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (rows > kMax || in > kMax || out > kMax) {
    return "cuBLASLt takes sizes below 2^31, got " + std::to_string(rows) +
           " rows, in " + std::to_string(in) + ", out " + std::to_string(out);
  }
  return "";
}

bool linear_weight_bias_grad(const torch::Tensor& grad,
                             const torch::Tensor& input,
                             torch::Tensor& d_weight, torch::Tensor& d_bias,
                             std::string& why) {
  c10::cuda::CUDAGuard guard(grad.device());
  if (!lt_aligned(grad) || !lt_aligned(input)) {
    why = "an operand is not 16-byte aligned";
    return false;
  }
  const int64_t rows = grad.size(0), out = grad.size(1), in = input.size(1);
  auto weight_out = torch::empty({out, in}, grad.options());
  auto bias_out = torch::empty({out}, grad.options());
  LtProduct p;
  p.transpose_a = false;
  p.transpose_b = true;
  p.m = in;
  p.n = out;
  p.k = rows;
  p.a = input.data_ptr();
  p.lda = in;
  p.b = grad.data_ptr();
  p.ldb = out;
  p.d = weight_out.data_ptr();
  p.ldd = in;
  p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  p.bias = bias_out.data_ptr();
  why = run_lt_product(p, grad.scalar_type(), grad);
  if (!why.empty()) {
    return false;
  }
  d_weight = weight_out;
  d_bias = bias_out;
  return true;
}

} // namespace detail
} // namespace lamp
