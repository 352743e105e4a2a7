#pragma once

// One cuBLASLt matrix product with an epilogue, for the ops whose biases,
// activations and bias gradients run inside their products (gelu_mlp,
// linear_bgrad). Compiled where lamp builds its CUDA kernels
// (cmake/LampCudaKernels.cmake); the functions are taken from the
// libcublasLt LibTorch loaded (platform/loaded_library.h): nothing of
// cuBLAS is linked.
//
// cuBLASLt is column-major: a row-major [rows, n] tensor is an n x rows
// matrix with leading dimension n. A product y = x w^T ([rows, in] x,
// [n, in] w) is y^T = w^T x^T: A = w read transposed (stored in x n, ld
// in), B = x (stored in x rows, ld in), D stored n x rows, ld n.

#include <cublasLt.h>
#include <torch/types.h>

#include <string>

namespace lamp {
namespace detail {

/// One product D = op(A) op(B), cuBLASLt's m x k times k x n, in one 16-bit
/// dtype with FP32 accumulation, and its epilogue. `bias` is the bias read
/// (BIAS epilogues) or the bias gradient written (BGRAD epilogues), in the
/// product's dtype; `aux` the pre-activation written (GELU_AUX) or read
/// (DGELU).
struct LtProduct {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0; // of A as stored: k x m where transposed, else m x k
  const void* b = nullptr;
  int64_t ldb = 0; // of B as stored: n x k where transposed, else k x n
  void* d = nullptr;
  int64_t ldd = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t ld_aux = 0;
};

/// Why cuBLASLt's functions cannot be used ("" when they all resolved from
/// the loaded libcublasLt).
const std::string& cublaslt_unavailable_reason();

/// Runs `p` in `dtype` (kHalf or kBFloat16) on the current stream of
/// `like`'s device, with a workspace from the caching allocator (a CUDA
/// graph's pool while one is captured). "" on success, else why not (a
/// status cuBLASLt returned, its handle's creation included, or no
/// algorithm for this product and epilogue): nothing is written then, and
/// the caller runs the ATen ops.
std::string run_lt_product(const LtProduct& p, at::ScalarType dtype,
                           const torch::Tensor& like);

/// Whether `t` is undefined or starts on 16 bytes, as cuBLASLt's epilogues
/// want their operands.
bool lt_aligned(const torch::Tensor& t);

} // namespace detail
} // namespace lamp
