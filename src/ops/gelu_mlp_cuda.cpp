// gelu_mlp's two fused products on cuBLASLt (ops/cublaslt.h, which says how
// row-major tensors map to its column-major products): the first linear
// with its bias and the GELU in the epilogue (the pre-activation kept as
// the epilogue's auxiliary output), and the product giving the GELU
// output's gradient with the GELU's derivative and the bias gradient in its
// epilogue. The bias runs along D's n rows.
#include "ops/gelu_mlp_cuda.h"

#include <c10/cuda/CUDAGuard.h>

#include <limits>
#include <string>

#include "ops/cublaslt.h"

namespace lamp {
namespace detail {
std::string gelu_mlp_epilogue_unavailable_reason(at::ScalarType dtype,
                                                 int64_t rows, int64_t in,
                                                 int64_t hidden, int64_t out) {
  if (!cublaslt_unavailable_reason().empty()) {
    return cublaslt_unavailable_reason();
  }
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return std::string(
               "the epilogues take FP16 and BF16 (autocast's "
               "dtypes), not ") +
           c10::toString(dtype);
  }
  // cuBLASLt documents no product of an empty dimension (the bias
  // gradient's epilogue might leave its output unwritten).
  if (hidden == 0 || out == 0) {
    return "the epilogues take no empty layer, got hidden " +
           std::to_string(hidden) + ", out " + std::to_string(out);
  }
  for (const auto size : {in, hidden, out}) {
    if (size % 8 != 0) {
      return "the epilogues want the widths to be multiples of 8, got in " +
             std::to_string(in) + ", hidden " + std::to_string(hidden) +
             ", out " + std::to_string(out);
    }
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (rows > kMax || in > kMax || hidden > kMax || out > kMax) {
    return "cuBLASLt takes sizes below 2^31, got " + std::to_string(rows) +
           " rows, " + std::to_string(in) + " inputs, " +
           std::to_string(hidden) + " hidden and " + std::to_string(out) +
           " outputs";
  }
  return "";
}

bool gelu_mlp_fc_forward(const torch::Tensor& x, const torch::Tensor& fc_weight,
                         const torch::Tensor& fc_bias, torch::Tensor& pre,
                         torch::Tensor& h, std::string& why) {
  c10::cuda::CUDAGuard guard(x.device());
  if (!lt_aligned(x) || !lt_aligned(fc_weight) || !lt_aligned(fc_bias)) {
    why = "an operand is not 16-byte aligned";
    return false;
  }
  const int64_t rows = x.size(0), in = x.size(1), hidden = fc_weight.size(0);
  auto pre_out = torch::empty({rows, hidden}, x.options());
  auto h_out = torch::empty({rows, hidden}, x.options());
  LtProduct p;
  p.transpose_a = true;
  p.m = hidden;
  p.n = rows;
  p.k = in;
  p.a = fc_weight.data_ptr();
  p.lda = in;
  p.b = x.data_ptr();
  p.ldb = in;
  p.d = h_out.data_ptr();
  p.ldd = hidden;
  p.epilogue = fc_bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                 : CUBLASLT_EPILOGUE_GELU_AUX;
  p.bias = fc_bias.defined() ? fc_bias.data_ptr() : nullptr;
  p.aux = pre_out.data_ptr();
  p.ld_aux = hidden;
  why = run_lt_product(p, x.scalar_type(), x);
  if (!why.empty()) {
    return false;
  }
  pre = pre_out;
  h = h_out;
  return true;
}

bool gelu_mlp_proj_backward(const torch::Tensor& grad,
                            const torch::Tensor& proj_weight,
                            const torch::Tensor& pre, bool want_bias,
                            torch::Tensor& d_pre, torch::Tensor& d_fc_bias,
                            std::string& why) {
  c10::cuda::CUDAGuard guard(grad.device());
  if (!lt_aligned(grad) || !lt_aligned(proj_weight) || !lt_aligned(pre)) {
    why = "an operand is not 16-byte aligned";
    return false;
  }
  // d_h = grad proj_weight: [rows, out] x [out, hidden]. Column-major:
  // d_h^T (hidden x rows) = proj_weight^T (stored hidden x out, ld hidden,
  // not transposed) times grad^T (stored out x rows, ld out).
  const int64_t rows = grad.size(0), out = grad.size(1);
  const int64_t hidden = proj_weight.size(1);
  auto d_pre_out = torch::empty({rows, hidden}, grad.options());
  auto bias_out =
      want_bias ? torch::empty({hidden}, grad.options()) : torch::Tensor();
  LtProduct p;
  p.transpose_a = false;
  p.m = hidden;
  p.n = rows;
  p.k = out;
  p.a = proj_weight.data_ptr();
  p.lda = hidden;
  p.b = grad.data_ptr();
  p.ldb = out;
  p.d = d_pre_out.data_ptr();
  p.ldd = hidden;
  p.epilogue =
      want_bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  p.bias = want_bias ? bias_out.data_ptr() : nullptr;
  p.aux = pre.data_ptr();
  p.ld_aux = hidden;
  why = run_lt_product(p, grad.scalar_type(), grad);
  if (!why.empty()) {
    return false;
  }
  d_pre = d_pre_out;
  d_fc_bias = bias_out;
  return true;
}

} // namespace detail
} // namespace lamp
