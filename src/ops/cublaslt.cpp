// The cuBLASLt product with an epilogue that gelu_mlp and linear_bgrad
// share (ops/cublaslt.h).
#include "ops/cublaslt.h"

#include <ATen/cuda/CUDAContext.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "platform/kernel_runs.h"
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
      a.unavailable = not_loaded_reason(soname, "cuBLASLt", CUBLAS_VER_MAJOR);
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

// lamp's own cuBLASLt handle per device in `handle`, made once (on the
// device current, the caller's) and kept for the process, never destroyed
// (at exit the CUDA context may be gone first). A failed creation is
// cublasLtCreate's status, tried again on the next call.
cublasStatus_t lt_handle(int device, cublasLtHandle_t& handle) {
  static auto* mutex = new std::mutex();
  static auto* handles = new std::vector<cublasLtHandle_t>();
  std::lock_guard<std::mutex> lock(*mutex);
  if (handles->size() <= static_cast<size_t>(device)) {
    handles->resize(static_cast<size_t>(device) + 1, nullptr);
  }
  auto& made = (*handles)[static_cast<size_t>(device)];
  auto status = CUBLAS_STATUS_SUCCESS;
  if (made == nullptr) {
    status = lt().create(&made);
    if (status != CUBLAS_STATUS_SUCCESS) {
      made = nullptr;
    }
  }
  handle = made;
  return status;
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

// The largest power of two, up to 256, that divides `p`'s address: what the
// heuristic is told of each operand, which it otherwise takes for 256-byte
// aligned (and may then pick a kernel the operand cannot run, returning
// NOT_SUPPORTED at the product), as PyTorch's and Transformer Engine's
// cuBLASLt calls tell it.
uint32_t alignment_bytes(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  uint32_t alignment = 1;
  while (alignment < 256 && address % (2 * alignment) == 0) {
    alignment *= 2;
  }
  return alignment;
}

// The status as a sentence for the caller's warning ("" on success).
std::string failure(const char* step, cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS
             ? std::string()
             : std::string("cuBLASLt's ") + step + " returned " +
                   lt().status_string(status);
}

} // namespace

const std::string& cublaslt_unavailable_reason() {
  return lt().unavailable;
}

std::string run_lt_product(const LtProduct& p, at::ScalarType dtype,
                           const torch::Tensor& like) {
  const int device = like.get_device();
  cublasLtHandle_t handle = nullptr;
  auto status = lt_handle(device, handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtCreate", status);
  }
  const auto type = data_type(dtype);
  cublasLtMatmulDesc_t raw_desc = nullptr;
  status = lt().desc_create(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return failure("cublasLtMatmulDescCreate", status);
  }
  MatmulDesc desc(raw_desc);
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
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
  // A is stored k x m and B n x k where read transposed.
  status = lt().layout_create(&raw_a, type, p.transpose_a ? p.k : p.m,
                              p.transpose_a ? p.m : p.k, p.lda);
  Layout layout_a(raw_a);
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = lt().layout_create(&raw_b, type, p.transpose_b ? p.n : p.k,
                                p.transpose_b ? p.k : p.n, p.ldb);
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
  // Split-K only with its partial sums in FP32, reduced in a fixed order
  // (COMPUTE_TYPE), or none: not INPLACE (atomic adds, an order that varies
  // from run to run) nor OUTPUT_TYPE (partial sums rounded to 16 bits).
  const uint32_t reductions =
      CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = lt().preference_set(preference.get(),
                                 CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                 &reductions, sizeof(reductions));
  }
  // C is D (beta 0, the same pointer).
  const struct {
    cublasLtMatmulPreferenceAttributes_t attribute;
    uint32_t bytes;
  } alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_bytes(p.a)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_bytes(p.b)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_bytes(p.d)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_bytes(p.d)},
  };
  for (const auto& alignment : alignments) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = lt().preference_set(preference.get(), alignment.attribute,
                                   &alignment.bytes, sizeof(alignment.bytes));
    }
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
  if (status == CUBLAS_STATUS_SUCCESS) {
    note_kernel_run(KernelPath::kLtEpilogue);
  }
  return failure("cublasLtMatmul", status);
}

bool lt_aligned(const torch::Tensor& t) {
  return !t.defined() ||
         reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

} // namespace detail
} // namespace lamp
