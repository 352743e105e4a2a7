#pragma once

/// \file
/// Fused operations that lamp's models use where LibTorch's own kernels leave
/// time on the table. Each one equals the composition of stock ops it
/// replaces, forward and backward, and falls back to that composition where
/// it has no fused kernel.

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace lamp {
namespace ops {

/// `max_pool2d(relu(input), kernel_size)` in one pass: non-overlapping
/// `kernel_size` x `kernel_size` windows (stride = kernel_size, no padding,
/// floor mode), differentiable once.
///
/// Semantics are those of the two stock ops in that order, forward and
/// backward: the output equals `torch::max_pool2d(torch::relu(input), k)`
/// (NaN propagates; a window with no positive value gives 0), and the
/// gradient goes to the first maximum of each window in row-major order
/// (the last NaN where there is one) when that maximum is positive or NaN,
/// and is 0 everywhere else, as max_pool2d's backward followed by relu's
/// does. The only difference: where the composition may return -0.0 this
/// returns +0.0 (equal under `torch::equal`).
///
/// Fused path: a CPU tensor of dtype float, double, BFloat16 or Half,
/// 4-D [N, C, H, W] and contiguous (NCHW), 1 <= kernel_size <= 15, H and W
/// at least kernel_size. It reads the input once, writes the pooled output
/// and keeps one byte per output for backward (the composition keeps the
/// full-size ReLU output and an int64 index per output). Any other input
/// (CUDA, channels_last, 3-D, ...) runs the stock composition.
///
/// Why: on CPU, LibTorch's max_pool2d over BF16 input is not vectorised in
/// some versions (1.13: 2.6 ms for a [64, 16, 28, 28] batch, more than the
/// convolution before it), and ReLU, its backward and the zero-filled
/// max-pool gradient are three more passes over the full-size activation.
///
/// Example:
/// \code
///   auto out = lamp::ops::relu_max_pool2d(conv1->forward(x), 2);
/// \endcode
///
/// \warning Differentiable once: backward() with create_graph=true through
/// this op throws (the fused backward is not itself differentiable).
torch::Tensor relu_max_pool2d(const torch::Tensor& input, int64_t kernel_size);

/// Whether relu_max_pool2d() takes its fused path for this input and kernel
/// size (otherwise it runs the stock composition).
bool relu_max_pool2d_is_fused(const torch::Tensor& input, int64_t kernel_size);

namespace detail {
/// The tensors the fused relu_max_pool2d keeps for backward, read from
/// `output.grad_fn()` (for tests and memory accounting): one uint8 tensor of
/// output's shape. Empty when `output` does not come from the fused path with
/// autograd recording.
std::vector<torch::Tensor> relu_max_pool2d_saved_tensors(
    const torch::Tensor& output);
} // namespace detail

} // namespace ops
} // namespace lamp
