// gelu_mlp's two fused products on cuBLASLt: the first linear with its bias
// and the GELU in the epilogue (the pre-activation kept as the epilogue's
// auxiliary output), and the product giving the GELU output's gradient with
// the GELU's derivative and the bias gradient in its epilogue.
//
// Row-major [rows, n] tensors are column-major [n, rows] matrices to
// cuBLASLt: a product y = x w^T ([rows, in] x, [n, in] w) is y^T = w^T x^T,
// A = w read transposed (stored in x n, ld in), B = x (stored in x rows,
// ld in), D stored n x rows, ld n; the bias runs along D's n rows.
#include "ops/gelu_mlp_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "platform/loaded_library.h"

namespace lamp {
namespace detail {
namespace {

// The cuBLASLt functions used here, resolved once from the libcublasLt
// LibTorch loaded (platform/loaded_library.h): a toolkit's copy linked
// beside it would be loaded first and serve LibTorch too.
struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  // Why the functions cannot be used; "" when they all resolved.
  std::string unavailable;
};

const CublasLt& lt() {
  static const CublasLt api = [] {
    CublasLt a;
    const std::string soname =
        "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* library = loaded_library(soname);
    if (library == nullptr) {
      a.unavailable = "no " + soname +
                      " could be loaded (the cuBLASLt this lamp was built "
                      "for, version " +
                      std::to_string(CUBLAS_VER_MAJOR) + ")";
      return a;
    }
    const auto need = [&](const char* symbol, auto& function) {
      resolve_symbol(library, symbol, function, "cuBLASLt", a.unavailable);
    };
    need("cublasLtCreate", a.create);
    need("cublasLtGetStatusString", a.status_string);
    need("cublasLtMatmulDescCreate", a.desc_create);
    need("cublasLtMatmulDescDestroy", a.desc_destroy);
    need("cublasLtMatmulDescSetAttribute", a.desc_set);
    need("cublasLtMatrixLayoutCreate", a.layout_create);
    need("cublasLtMatrixLayoutDestroy", a.layout_destroy);
    need("cublasLtMatmulPreferenceCreate", a.preference_create);
    need("cublasLtMatmulPreferenceDestroy", a.preference_destroy);
    need("cublasLtMatmulPreferenceSetAttribute", a.preference_set);
    need("cublasLtMatmulAlgoGetHeuristic", a.heuristic);
    need("cublasLtMatmul", a.matmul);
    return a;
  }();
  return api;
}

// lamp's own cuBLASLt handle per device, made once, kept for the process.
cublasLtHandle_t lt_handle(int device) {
  static std::mutex mutex;
  static std::vector<cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (handles.size() <= static_cast<size_t>(device)) {
    handles.resize(static_cast<size_t>(device) + 1, nullptr);
  }
  auto& handle = handles[static_cast<size_t>(device)];
  if (handle == nullptr) {
    const auto status = lt().create(&handle);
    TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS,
                "lamp::ops::gelu_mlp: cublasLtCreate failed (",
                lt().status_string(status), ").");
  }
  return handle;
}

// cuBLASLt's descriptors, destroyed on every way out.
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { lt().desc_destroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const {
    lt().layout_destroy(d);
  }
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const {
    lt().preference_destroy(d);
  }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference =
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

cudaDataType_t data_type(at::ScalarType dtype) {
  return dtype == at::kHalf ? CUDA_R_16F : CUDA_R_16BF;
}

// The status as a sentence for the caller's warning ("" on success).
std::string failure(const char* step, cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS
             ? std::string()
             : std::string("cuBLASLt's ") + step + " returned " +
                   lt().status_string(status);
}

// One product D = op(A) B (column-major, sizes as cuBLASLt's m x k times
// k x n) with `epilogue`, its bias and auxiliary pointers set where given.
// "" on success, else why not.
struct Product {
  bool transpose_a = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr; // the bias read, or the bias gradient written
  void* aux = nullptr;        // the pre-activation (written, or read)
  int64_t ld_aux = 0;
};

std::string run(const Product& p, at::ScalarType dtype,
                const torch::Tensor& like) {
  const int device = like.get_device();
  const auto handle = lt_handle(device);
  const auto type = data_type(dtype);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  auto status = lt().desc_create(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtMatmulDescCreate", status);
  }
  MatmulDesc desc(raw_desc);
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  const auto set = [&](cublasLtMatmulDescAttributes_t attribute,
                       const void* value, size_t size) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = lt().desc_set(desc.get(), attribute, value, size);
    }
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue));
  if (p.bias != nullptr) {
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
  }
  if (p.aux != nullptr) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.ld_aux, sizeof(p.ld_aux));
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtMatmulDescSetAttribute", status);
  }
  cublasLtMatrixLayout_t raw_a = nullptr, raw_b = nullptr, raw_d = nullptr;
  // A is stored k x m where read transposed.
  status = lt().layout_create(&raw_a, type, p.transpose_a ? p.k : p.m,
                              p.transpose_a ? p.m : p.k, p.lda);
  Layout layout_a(raw_a);
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = lt().layout_create(&raw_b, type, p.k, p.n, p.ldb);
  }
  Layout layout_b(raw_b);
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = lt().layout_create(&raw_d, type, p.m, p.n, p.ldd);
  }
  Layout layout_d(raw_d);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtMatrixLayoutCreate", status);
  }
  // Transformer Engine's and Apex's sizes: 32 MiB on Hopper and later, 4
  // MiB before; from the caching allocator (a CUDA graph's pool when
  // captured).
  const auto* properties = at::cuda::getDeviceProperties(device);
  const size_t workspace_bytes =
      (properties->major >= 9 ? 32u : 4u) * 1024u * 1024u;
  const auto workspace = torch::empty({static_cast<int64_t>(workspace_bytes)},
                                      like.options().dtype(at::kByte));
  cublasLtMatmulPreference_t raw_preference = nullptr;
  status = lt().preference_create(&raw_preference);
  Preference preference(raw_preference);
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = lt().preference_set(preference.get(),
                                 CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                 &workspace_bytes, sizeof(workspace_bytes));
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtMatmulPreference", status);
  }
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  status = lt().heuristic(handle, desc.get(), layout_a.get(), layout_b.get(),
                          layout_d.get(), layout_d.get(), preference.get(), 1,
                          &heuristic, &found);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtMatmulAlgoGetHeuristic", status);
  }
  if (found == 0) {
    return "cuBLASLt has no algorithm for this product and epilogue";
  }
  const float alpha = 1.0f, beta = 0.0f;
  status = lt().matmul(handle, desc.get(), &alpha, p.a, layout_a.get(), p.b,
                       layout_b.get(), &beta, p.d, layout_d.get(), p.d,
                       layout_d.get(), &heuristic.algo, workspace.data_ptr(),
                       workspace_bytes,
                       at::cuda::getCurrentCUDAStream(device).stream());
  return failure("cublasLtMatmul", status);
}

bool aligned(const torch::Tensor& t) {
  // cuBLASLt's epilogues want 16-byte operands.
  return !t.defined() ||
         reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

} // namespace

std::string gelu_mlp_epilogue_unavailable_reason(at::ScalarType dtype,
                                                 int64_t rows, int64_t in,
                                                 int64_t hidden, int64_t out) {
  if (!lt().unavailable.empty()) {
    return lt().unavailable;
  }
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return std::string(
               "the epilogues take FP16 and BF16 (autocast's "
               "dtypes), not ") +
           c10::toString(dtype);
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
           " rows";
  }
  return "";
}

bool gelu_mlp_fc_forward(const torch::Tensor& x, const torch::Tensor& fc_weight,
                         const torch::Tensor& fc_bias, torch::Tensor& pre,
                         torch::Tensor& h, std::string& why) {
  c10::cuda::CUDAGuard guard(x.device());
  if (!aligned(x) || !aligned(fc_weight) || !aligned(fc_bias)) {
    why = "an operand is not 16-byte aligned";
    return false;
  }
  const int64_t rows = x.size(0), in = x.size(1), hidden = fc_weight.size(0);
  auto pre_out = torch::empty({rows, hidden}, x.options());
  auto h_out = torch::empty({rows, hidden}, x.options());
  Product p;
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
  why = run(p, x.scalar_type(), x);
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
  if (!aligned(grad) || !aligned(proj_weight) || !aligned(pre)) {
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
  Product p;
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
  why = run(p, grad.scalar_type(), grad);
  if (!why.empty()) {
    return false;
  }
  d_pre = d_pre_out;
  d_fc_bias = bias_out;
  return true;
}

} // namespace detail
} // namespace lamp
