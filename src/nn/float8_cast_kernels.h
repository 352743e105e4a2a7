#pragma once

// The one-pass FP8 casts of lamp's FP8 layers (src/nn/float8_cast_kernels.cu)
// behind an interface of plain pointers, so that the CUDA source includes no
// LibTorch header: src/nn/float8_cast_cuda.cpp checks and allocates the
// tensors and calls this on the current stream.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace lamp {
namespace nn {
namespace kernels {

/// The source tensor's element type.
enum class Float8Source { kFloat, kHalf, kBFloat16 };
/// The FP8 format cast to.
enum class Float8Format { kE4M3, kE5M2 };

/// One operand's cast and the bookkeeping of internal::cast_operand(), on
/// the device. Every float pointer below `output` is one FP32 value.
///
/// Delayed scaling: one kernel reads each element once, writes
/// clamp(x * scale, +-max) in FP8 (NaN for an infinite x) and reduces
/// max |x|; the last block to
/// finish reads the blocks' amaxes and updates the state. Current scaling:
/// one kernel reduces max |x| and its last block computes the scale
/// (max / 2^margin / max(amax, 1e-12)) and the state; a second writes x *
/// scale in FP8 (no clamp: the scale keeps it in range).
///
/// With `transposed` set, the input is a row-major [rows, cols] matrix and
/// the cast pass (the one kernel of delayed scaling, the second of current
/// scaling) goes tile by tile, writing each tile's FP8 values to `output`
/// and, through shared memory, to `transposed` ([cols, rows], row-major):
/// the transpose costs no pass of its own over memory.
struct Float8CastArgs {
  const void* input = nullptr; // numel elements, contiguous
  int64_t numel = 0;
  Float8Source source = Float8Source::kFloat;
  void* output = nullptr; // numel FP8 bytes
  Float8Format format = Float8Format::kE4M3;
  float max = 448.0f;             // the format's largest finite value
  float saturated_above = 448.0f; // delayed: amax * scale above it saturated
  float max_over_margin = 448.0f; // max / 2^margin (current scaling)
  bool delayed = false;
  const float* scale = nullptr; // delayed: the scale to cast with
  float* cast_scale = nullptr;  // current: the scale computed, for the cast
  float* pending_amax = nullptr;
  float* saturated = nullptr;
  float* non_finite = nullptr;
  float* last_scale = nullptr;
  float* casts = nullptr;
  float* inverse_scale = nullptr;   // 1 / the scale used
  unsigned* partial_amax = nullptr; // [blocks]: max |x|'s bits per block
  unsigned* blocks_done = nullptr;  // one counter, zeroed
  int blocks = 1;
  void* transposed = nullptr; // rows * cols FP8 bytes, or none
  int64_t rows = 0;
  int64_t cols = 0;
};

/// Launches the cast on `stream`; returns the first launch error.
cudaError_t float8_cast(const Float8CastArgs& args, cudaStream_t stream);

/// The format's largest value `max` over 2^margin, as the ATen ops round it:
/// the quotient in double, then FP32.
inline float float8_max_over_margin(double max, int64_t margin) {
  return static_cast<float>(max / std::ldexp(1.0, static_cast<int>(margin)));
}

/// The cast's blocks for `numel` values: one per 1024 values, at most 4 a
/// multiprocessor (each striding over its share), at least one.
inline int64_t float8_cast_blocks(int64_t numel, int64_t multiprocessors) {
  const int64_t wanted = (numel + 1023) / 1024;
  const int64_t most = 4 * multiprocessors;
  const int64_t blocks = wanted < most ? wanted : most;
  return blocks > 1 ? blocks : 1;
}

} // namespace kernels
} // namespace nn
} // namespace lamp
