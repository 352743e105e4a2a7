#pragma once

// The NCCL backend, built by src/cuda/ when the LibTorch has CUDA and NCCL.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#define LAMP_COMPAT_C10D
#include "detail/compat.h"

namespace lamp {
namespace detail {

/// A c10d NCCL backend over `store`; throws a clear error where this
/// LibTorch has no NCCL.
c10::intrusive_ptr<C10dBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout);

} // namespace detail
} // namespace lamp
