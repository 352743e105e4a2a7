#pragma once

// The CUDA kernel of the conv level's per-channel elementwise steps
// (src/ops/channel_affine_kernels.cu), behind an interface of plain
// pointers so that the CUDA source includes no LibTorch header:
// src/ops/channel_affine_cuda.cpp checks and allocates the tensors and
// calls this on the current stream. Every tensor is NHWC-contiguous
// ([rows, channels], rows = N H W) or [channels].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/add_norm_kernels.h" // kernels::Dtype

namespace lamp {
namespace detail {
namespace kernels {

/// out = relu?((gate(u) * u_scale + u_shift) + (v * v_scale + v_shift)),
/// each value in FP32, one operation at a time in that order, each rounded
/// to FP32 (no fused multiply-add: the ATen ops it replaces round each),
/// then rounded to out's type. gate(u) is u where gate > 0 and 0 elsewhere.
/// A null pointer leaves its step out (u null: 0; v null: no second term).
struct ChannelAffineArgs {
  const void* u = nullptr;        // [rows, channels] or null (zeros)
  const void* gate = nullptr;     // [rows, channels] or null
  const float* u_scale = nullptr; // [channels] or null
  const float* u_shift = nullptr; // [channels] or null
  const void* v = nullptr;        // [rows, channels] or null
  const float* v_scale = nullptr; // [channels] or null
  const float* v_shift = nullptr; // [channels] or null
  bool relu = false;
  void* out = nullptr; // [rows, channels]
  int64_t rows = 0;
  int64_t channels = 0;
  Dtype dtype = Dtype::kFloat; // of u, gate, v and out alike
  // 16-byte loads and stores (channels a multiple of 16 bytes' worth of
  // elements, every pointer 16-byte aligned), else one element at a time.
  bool vectorized = false;
  int max_blocks = 1; // the grid's cap (the loop strides over the rest)
};

/// Launches the kernel on `stream`; returns the launch's error.
cudaError_t channel_affine(const ChannelAffineArgs& args, cudaStream_t stream);

/// Whether `a` (its channels, dtype and pointers set) takes the 16-byte
/// loads and stores: the channels a multiple of 16 bytes' worth of
/// elements, every tensor's pointer on a 16-byte boundary.
inline bool channel_affine_vectorizable(const ChannelAffineArgs& a) {
  const int64_t element_bytes = a.dtype == Dtype::kFloat ? 4 : 2;
  const auto aligned = [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; // null too
  };
  return a.channels % (16 / element_bytes) == 0 && aligned(a.u) &&
         aligned(a.gate) && aligned(a.v) && aligned(a.out);
}

/// The grid's cap: 8 blocks a multiprocessor, each striding over its share.
inline int channel_affine_max_blocks(int multiprocessors) {
  return multiprocessors * 8;
}

/// Per-channel sums over the rows of g = gate(u) (as ChannelAffineArgs's)
/// and of g a and g b: sums[0][c] = sum g, sums[1][c] = sum g a,
/// sums[2][c] = sum g b (a or b null: that sum is 0). Each of `blocks`
/// blocks sums a contiguous range of rows into its row of `partial` (its
/// three sums); a second kernel adds the blocks' rows in block order, so
/// the sums are the same from run to run (no atomics).
struct GatedSumsArgs {
  const void* u = nullptr;    // [rows, channels]
  const void* gate = nullptr; // [rows, channels] or null
  const void* a = nullptr;    // [rows, channels] or null
  const void* b = nullptr;    // [rows, channels] or null
  float* partial = nullptr;   // [blocks, 3, channels]
  float* sums = nullptr;      // [3, channels]
  int64_t rows = 0;
  int64_t channels = 0;
  Dtype dtype = Dtype::kFloat; // of u, gate, a and b alike
  int blocks = 1;
};

/// Launches both kernels on `stream`; returns the first launch error.
cudaError_t gated_sums(const GatedSumsArgs& args, cudaStream_t stream);

/// The sums' blocks for `rows` rows: 4 a multiprocessor, at most a row each.
inline int gated_sums_blocks(int64_t rows, int multiprocessors) {
  const int64_t most = static_cast<int64_t>(multiprocessors) * 4;
  return static_cast<int>(rows < most ? rows : most);
}

} // namespace kernels
} // namespace detail
} // namespace lamp
