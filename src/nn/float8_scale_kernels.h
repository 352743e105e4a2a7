#pragma once

// The end of a step of delayed scaling for many FP8 layers in one kernel
// (src/nn/float8_scale_kernels.cu), behind an interface of plain pointers,
// so that the CUDA source includes no LibTorch header:
// src/nn/float8_scale_cuda.cpp gathers the layers' tensors and calls this on
// the current stream.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "nn/float8_cast_kernels.h" // float8_max_over_margin

namespace lamp {
namespace nn {
namespace kernels {

/// One layer's tensors of delayed scaling (Float8StateImpl's), on the
/// device, FP32 and contiguous.
struct Float8ScaleLayer {
  float* history =
      nullptr; // [3, history_len], row o operand o, column 0 newest
  float* pending = nullptr; // [3]
  float* scale = nullptr;   // [3]
  int history_len = 1;
  /// The amax is the history's maximum (else its newest value).
  bool history_max = true;
  /// Per operand, the format's max over 2^margin: 448 / 2^m for the input
  /// and the weight (E4M3), 57344 / 2^m for the gradient (E5M2).
  float max_over_margin[3] = {448.0f, 448.0f, 57344.0f};
};

/// One layer's entry: its state's tensors (`history` [3, history_len]), how
/// the recipe reads the history, and its margin's factors (E4M3's 448 for
/// the input and the weight, E5M2's 57344 for the gradient).
inline Float8ScaleLayer scale_layer(float* history, float* pending,
                                    float* scale, int history_len,
                                    bool history_max, int64_t margin) {
  Float8ScaleLayer layer;
  layer.history = history;
  layer.pending = pending;
  layer.scale = scale;
  layer.history_len = history_len;
  layer.history_max = history_max;
  layer.max_over_margin[0] = float8_max_over_margin(448.0, margin);
  layer.max_over_margin[1] = float8_max_over_margin(448.0, margin);
  layer.max_over_margin[2] = float8_max_over_margin(57344.0, margin);
  return layer;
}

/// As many layers as one launch's arguments carry (4 KiB is the limit of a
/// kernel's parameters on every architecture CUDA 12 builds for).
constexpr int kScaleLayersPerLaunch = 64;

struct Float8ScaleArgs {
  Float8ScaleLayer layers[kScaleLayersPerLaunch];
  int count = 0;
};

/// For each layer and operand, in update_float8_scales()'s order and FP32
/// arithmetic: the history moves one column older (the oldest falls off),
/// the pending amax becomes its newest value, the scale becomes max / 2^m
/// times 1 / amax where amax > 0 (kept elsewhere), and the pending amax is
/// zeroed. The largest history this takes is
/// float8_scale_update_max_history() columns.
cudaError_t float8_update_scales(const Float8ScaleArgs& args,
                                 cudaStream_t stream);

/// The longest history one block shifts in shared memory.
int float8_scale_update_max_history();

} // namespace kernels
} // namespace nn
} // namespace lamp
