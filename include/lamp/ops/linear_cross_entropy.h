#pragma once

/// \file
/// A language model's output head and its cross-entropy in one operation,
/// computed a chunk of rows at a time so that the probabilities of the whole
/// batch ([rows, vocab], the largest tensor of a GPT's step once the
/// vocabulary is large) never exist.

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>

namespace lamp {
namespace ops {

/// Options of linear_cross_entropy().
struct LinearCrossEntropyOptions {
  /// Rows of the input per chunk: each chunk's logits are [chunk_rows,
  /// vocab]. 0 picks linear_cross_entropy_chunk_rows() (chunks whose
  /// logits are about as large as the whole input or the weight).
  TORCH_ARG(int64_t, chunk_rows) = 0;
  /// The sum of the rows' losses instead of their mean.
  TORCH_ARG(bool, sum) = false;
};

/// `cross_entropy(linear(input, weight).to(kFloat), targets)` (mean over the
/// rows, or their sum; the weight in the input's dtype outside autocast),
/// without materializing the logits of every row at once: the rows are taken `chunk_rows` at a time; for each chunk the
/// logits are computed, reduced to each row's loss and, when a gradient is
/// wanted, turned into the gradient of the input's rows and added to the
/// weight's (softmax minus the one-hot target, multiplied back through the
/// two products: the forward and the backward in one pass, as llm.c's fused
/// classifier does). The backward then only scales the kept gradients by
/// the loss's gradient.
///
/// - `input` [..., width] (a GPT's hidden states [B, T, width] after its
///   final norm), `weight` [vocab, width] (the tied token embedding),
///   `targets` of the input's leading shape ([B, T]), any integer type, each
///   in [0, vocab) or -100 (F::cross_entropy's ignore_index: a padded row,
///   without a loss or a gradient, left out of the mean). On the CPU a
///   target outside these is refused; on a GPU it is not checked (that
///   would wait for the device) and ends in a device-side assert.
/// - Returns a 0-dim FP32 tensor: NaN for a mean over rows that are all
///   -100, as F::cross_entropy's.
/// - Precision: the products run in autocast's dtype (BF16/FP16) where
///   autocast is on for the input's device, as linear would under it, else
///   in the input's (the weight cast to it); the softmax, the loss and
///   the weight's gradient are summed in FP32. The weight's gradient reaches
///   it in its own dtype (an FP32 weight gets the FP32 sum, not a 16-bit
///   product cast up).
/// - Memory kept for the backward: the input's gradient ([rows, width] in
///   the products' dtype) and the weight's in FP32 ([vocab, width]), against the reference's
///   16-bit logits, their FP32 copy and the FP32 log-probabilities (about 10
///   bytes per row and vocabulary entry under autocast). Without a gradient
///   wanted (no grad mode, or neither input nor weight requiring one), only
///   the loss is computed.
///
/// Compared with linear_cross_entropy_reference(): FP32 inputs agree to
/// FP32 rounding (the chunks sum in another order). With 16-bit products
/// each chunk's part of the weight's gradient is rounded to 16 bits once
/// before the FP32 sum, where the reference rounds the whole product once;
/// with a single chunk (a vocabulary at most the width, as bytes' 256 with
/// width 384) the products are the reference's.
///
/// Throws c10::Error, naming the argument and the fix, on a shape that does
/// not fit (the widths, the targets' shape), no rows, targets that are not
/// integers (or, on the CPU, outside the vocabulary), inputs that are not
/// floating point, tensors on different devices, or a negative chunk_rows.
///
/// Example (a GPT's training loss, as models::GPTImpl::loss() computes it):
/// \code
///   auto hidden = gpt->features(tokens);                  // [B, T, width]
///   auto loss = lamp::ops::linear_cross_entropy(hidden, gpt->wte->weight,
///                                               next_tokens);  // [B, T]
///   loss.backward();
/// \endcode
///
/// \warning Differentiable once: the backward scales gradients computed in
/// the forward, so a backward with create_graph=true stops with an error
/// naming linear_cross_entropy_reference(), which gives second derivatives.
torch::Tensor linear_cross_entropy(
    const torch::Tensor& input, const torch::Tensor& weight,
    const torch::Tensor& targets,
    const LinearCrossEntropyOptions& options = {});

/// The composition linear_cross_entropy() replaces, in stock ops:
/// `cross_entropy(linear(input, weight.to(input's dtype)).to(kFloat),
/// targets)` over the flattened rows (mean, or sum with `sum`). Its tests' reference; the same
/// arguments and checks.
torch::Tensor linear_cross_entropy_reference(const torch::Tensor& input,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& targets,
                                             bool sum = false);

/// The chunk linear_cross_entropy() takes when chunk_rows is 0, for `rows`
/// rows of `width` and a vocabulary of `vocab`: the rows whose logits hold
/// about as many elements as the larger of the input (rows x width) and the
/// weight (vocab x width), that is at least `width` rows, rounded up to a
/// multiple of 64, at most `rows` (all of them where the vocabulary is at
/// most the width). All three must be positive.
int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t width,
                                        int64_t vocab);

} // namespace ops
} // namespace lamp
