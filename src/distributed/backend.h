#pragma once

// The c10d backends behind lamp::distributed::ProcessGroup: NCCL
// (src/distributed/nccl.cpp, where the LibTorch has CUDA and NCCL) and Gloo
// (src/distributed/gloo.cpp, where Gloo's headers were found).

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#define LAMP_COMPAT_C10D
#include "platform/compat.h"

namespace lamp {
namespace detail {

/// A c10d NCCL backend over `store`; throws a clear error where this
/// LibTorch has no NCCL.
c10::intrusive_ptr<C10dBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout);

/// A c10d Gloo backend over `store` (GLOO_SOCKET_IFNAME picks the network
/// interface); throws kNoGlooMessage where lamp was built without Gloo.
c10::intrusive_ptr<C10dBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout);

/// Why a Gloo process group cannot be made in a build without Gloo, and what
/// to do.
constexpr const char* kNoGlooMessage =
    "this lamp was built without Gloo (no gloo headers were found at build time); install libgloo-dev and rebuild, or use nccl on CUDA.";

} // namespace detail
} // namespace lamp
