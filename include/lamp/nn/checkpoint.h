#pragma once

/// \file
/// Activation checkpointing (Python's torch.utils.checkpoint, which
/// LibTorch's C++ API lacks): a piece of a model whose intermediate
/// activations are not kept for the backward but computed again there,
/// trading a second forward of the piece for its activations' memory.

#include <torch/types.h>

#include <functional>
#include <vector>

namespace lamp {
namespace nn {

/// `body(input)`, run without keeping its intermediates: the backward runs
/// `body` again on the saved input, with grad mode on, and takes the
/// gradients of `input` and of `parameters` (the tensors `body` uses that
/// may need gradients: a module's parameters(), where a tied weight listed
/// under two names counts once) from that second forward.
///
/// The second forward runs as the first did, so that its results are the
/// same bit for bit: under the same autocast state (enabled and dtype, on
/// the CPU and on CUDA), and, with `preserve_rng`, from the same state of
/// the random generator of the input's device (a dropout draws the same
/// mask). The gradients then equal an uncheckpointed backward's bit for bit
/// where the ops are deterministic.
///
/// Without grad mode, or when neither `input` nor a parameter requires a
/// gradient, it is `body(input)`. `body` must return one tensor computed
/// from `input` and `parameters` only (other tensors it reads get no
/// gradient).
///
/// Throws c10::Error, naming the fix, from the backward when it runs a
/// second time (retain_graph is not supported), when `input` was changed
/// in place after the forward, or when asked for higher-order gradients
/// (create_graph=true: differentiable once); and from the forward when
/// `preserve_rng` meets a CUDA graph capture (a generator's state cannot be
/// read there: use no dropout, or no graph).
torch::Tensor activation_checkpoint(
    const std::function<torch::Tensor(const torch::Tensor&)>& body,
    const torch::Tensor& input, const std::vector<torch::Tensor>& parameters,
    bool preserve_rng = true);

} // namespace nn
} // namespace lamp
