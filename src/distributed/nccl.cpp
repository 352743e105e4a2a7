// The NCCL backend of lamp::distributed::ProcessGroup (CUDA collectives).

#include "distributed/backend.h"

// NCCL: where this LibTorch was built with it and its header is found.
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>) && \
    __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define LAMP_HAVE_NCCL 1
#else
#define LAMP_HAVE_NCCL 0
#endif

namespace lamp {
namespace detail {

c10::intrusive_ptr<C10dBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout) {
#if LAMP_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size,
                                                     options);
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)timeout;
  TORCH_CHECK(
      false,
      "lamp::distributed: this lamp was built without NCCL (the LibTorch has no CUDA or no USE_C10D_NCCL, or nccl.h was not found). Rebuild lamp with NCCL's headers on the include path, or use backend gloo.");
#endif
}

} // namespace detail
} // namespace lamp
