// The output head and cross-entropy, a chunk of rows at a time.
#include "lamp/ops/linear_cross_entropy.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "platform/autocast_on.h"
#include "platform/compat.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace ops {
namespace {

constexpr const char* kLinearCrossEntropyWho =
    "lamp::ops::linear_cross_entropy";
// Chunks are a multiple of this many rows (whole tiles of the products).
constexpr int64_t kRowMultiple = 64;
// The target of a row without a loss (padding): F::cross_entropy's default
// ignore_index.
constexpr int64_t kIgnoreIndex = -100;

bool autocast_eligible(at::ScalarType dtype) {
  return dtype == torch::kFloat || dtype == torch::kBFloat16 ||
         dtype == torch::kHalf;
}

// The rows as [rows, width] and the targets as int64 [rows], after the
// checks both entry points share.
std::pair<torch::Tensor, torch::Tensor> rows_of(const torch::Tensor& input,
                                                const torch::Tensor& weight,
                                                const torch::Tensor& targets,
                                                const char* who) {
  TORCH_CHECK(input.defined() && weight.defined() && targets.defined(), who,
              ": the input, the weight and the targets must all be given.");
  TORCH_CHECK(input.is_floating_point() && weight.is_floating_point(), who,
              ": the input and the weight must be floating point, got ",
              input.scalar_type(), " and ", weight.scalar_type(), ".");
  TORCH_CHECK(!targets.is_floating_point() && !targets.is_complex() &&
                  targets.scalar_type() != torch::kBool,
              who, ": the targets must be integer token ids, got ",
              targets.scalar_type(), "; convert them with .to(torch::kLong).");
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) > 0 && weight.size(1) > 0,
              who,
              ": the weight must be [vocab, width] with both positive, got ",
              weight.sizes(), ".");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == weight.size(1), who,
              ": the input's last dimension must be the weight's width ",
              weight.size(1), "; got input ", input.sizes(), " and weight ",
              weight.sizes(), ".");
  const auto leading = input.sizes().slice(0, input.dim() - 1);
  TORCH_CHECK(targets.sizes() == leading, who, ": the targets ",
              targets.sizes(), " must have the input's leading shape ", leading,
              " (one target per row of the input ", input.sizes(), ").");
  TORCH_CHECK(
      input.device() == weight.device() && targets.device() == input.device(),
      who, ": the input (", input.device(), "), the weight (", weight.device(),
      ") and the targets (", targets.device(), ") must be on one device.");
  const int64_t rows = targets.numel();
  TORCH_CHECK(rows > 0, who, ": no rows (input ", input.sizes(),
              "): an empty batch has no loss; give at least one row.");
  auto flat = targets.reshape({rows}).to(torch::kLong);
  // What gather would refuse with an index error (on a GPU a device-side
  // assert that ends the process's CUDA): checked on the CPU, where it costs
  // a pass over the targets; a GPU's are not (that would wait for it).
  if (flat.device().is_cpu()) {
    const auto vocab = weight.size(0);
    const auto bad = flat.ne(kIgnoreIndex)
                         .logical_and(flat.lt(0).logical_or(flat.ge(vocab)));
    TORCH_CHECK(!bad.any().item<bool>(), who, ": a target of ",
                flat.masked_select(bad)[0].item<int64_t>(),
                " is outside the vocabulary [0, ", vocab, ") of the weight ",
                weight.sizes(),
                " (and not -100, which marks a row without a loss); the "
                "targets come from another vocabulary than the weight's.");
  }
  return {input.reshape({rows, weight.size(1)}), flat};
}

// The dtype the products run in: autocast's where it is on for the device
// and would cast both operands (as it does for linear), else the input's
// (the weight cast to it, as a GPT's head does where network_to_half kept
// the embedding in FP32).
at::ScalarType compute_dtype(const torch::Tensor& input,
                             const torch::Tensor& weight) {
  const auto device_type = input.device().type();
  if (lamp::detail::autocast_on(device_type) &&
      autocast_eligible(input.scalar_type()) &&
      autocast_eligible(weight.scalar_type())) {
    return lamp::detail::autocast_dtype(device_type);
  }
  return input.scalar_type();
}

struct Chunked {
  torch::Tensor loss_sum;    // FP32, 0-dim: the rows' losses summed
  torch::Tensor counted;     // FP32, 0-dim: the rows with a loss
  torch::Tensor grad_input;  // [rows, width], compute dtype, or undefined
  torch::Tensor grad_weight; // [vocab, width], FP32, or undefined
};

// The pass over the chunks. The gradients are those of the summed loss (no
// 1/rows): softmax minus one-hot lies in [-1, 1], which FP16 holds; the
// factors (1/rows, the loss scale) come in the backward, after the
// products, so that FP16 products do not underflow before a GradScaler's
// scale reaches them.
Chunked chunked_pass(const torch::Tensor& input, const torch::Tensor& weight,
                     const torch::Tensor& targets, int64_t chunk_rows,
                     at::ScalarType compute, bool gradients) {
  const int64_t rows = input.size(0), width = input.size(1);
  const int64_t vocab = weight.size(0);
  const auto w = weight.to(compute);
  Chunked out;
  out.loss_sum = torch::zeros({}, input.options().dtype(torch::kFloat));
  out.counted = targets.ne(kIgnoreIndex).sum().to(torch::kFloat);
  // The one-hot's -1 for every row of a chunk, made once (not per chunk).
  torch::Tensor minus_one;
  if (gradients) {
    minus_one = torch::full({std::min(chunk_rows, rows), 1}, -1.0,
                            input.options().dtype(torch::kFloat));
    out.grad_input =
        torch::empty({rows, width}, input.options().dtype(compute));
    out.grad_weight =
        torch::zeros({vocab, width}, weight.options().dtype(torch::kFloat));
  }
  for (int64_t start = 0; start < rows; start += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - start);
    auto x = input.narrow(0, start, n).to(compute);
    // Rows whose target is -100 have no loss and no gradient: their target
    // read as 0, their loss, their input's gradient and their input row in
    // the weight's gradient zeroed, not the logits (the largest tensor).
    const auto given = targets.narrow(0, start, n).unsqueeze(1);
    const auto kept = given.ne(kIgnoreIndex);
    const auto t = given.masked_fill(kept.logical_not(), 0);
    // As linear then .to(kFloat): the product rounded to the compute dtype.
    auto logits = torch::mm(x, w.t()).to(torch::kFloat);
    const auto lse = logits.logsumexp(1, /*keepdim=*/true);
    out.loss_sum.add_(
        (lse - logits.gather(1, t)).masked_fill_(kept.logical_not(), 0).sum());
    if (!gradients) {
      continue;
    }
    // softmax - one-hot, in place of the logits.
    logits.sub_(lse).exp_();
    logits.scatter_add_(1, t, minus_one.narrow(0, 0, n));
    const auto g = logits.to(compute);
    out.grad_input.narrow(0, start, n).copy_(torch::mm(g, w).mul_(kept));
    x = x.mul(kept);
    if (compute == torch::kFloat) {
      out.grad_weight.addmm_(g.t(), x);
    } else {
      out.grad_weight.add_(torch::mm(g.t(), x));
    }
  }
  return out;
}

class LinearCrossEntropyFunction
    : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& input,
                               const torch::Tensor& weight,
                               const torch::Tensor& targets, int64_t chunk_rows,
                               bool sum, at::ScalarType compute) {
    const int64_t rows = targets.numel();
    const auto in2d = input.reshape({rows, weight.size(1)});
    auto pass = chunked_pass(in2d, weight, targets.reshape({rows}), chunk_rows,
                             compute, /*gradients=*/true);
    ctx->save_for_backward({pass.grad_input, pass.grad_weight, pass.counted});
    ctx->saved_data["input_shape"] = input.sizes().vec();
    ctx->saved_data["input_dtype"] = input.scalar_type();
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    ctx->saved_data["sum"] = sum;
    return sum ? pass.loss_sum : pass.loss_sum / pass.counted;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    lamp::detail::refuse_higher_order_gradients(
        "lamp::ops::linear_cross_entropy",
        "linear_cross_entropy_reference (the stock composition) gives them.");
    const auto saved = ctx->get_saved_variables();
    const auto& d = ctx->saved_data;
    // The loss's gradient (a GradScaler's scale, usually) over the rows
    // with a loss for the mean: one FP32 factor, applied once to each kept
    // gradient.
    auto factor = grad_outputs[0].to(torch::kFloat);
    if (!d.at("sum").toBool()) {
      // No row with a loss (every target -100): the stock composition's
      // mean is NaN, and its gradient zero, as no row takes the 1/0 factor;
      // 0 * inf here would make every gradient NaN.
      const auto& counted = saved[2];
      factor = torch::where(counted > 0, factor / counted,
                            torch::zeros_like(factor));
    }
    torch::autograd::variable_list grads(6);
    if (ctx->needs_input_grad(0)) {
      // In the kept gradient's dtype, computed in FP32 and rounded once: a
      // 16-bit 2-D gradient times a 0-dim FP32 factor would run in 16 bits
      // (ATen's promotion), the factor rounded first.
      grads[0] = (saved[0].to(torch::kFloat) * factor)
                     .to(d.at("input_dtype").toScalarType())
                     .view(d.at("input_shape").toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      grads[1] = (saved[1] * factor).to(d.at("weight_dtype").toScalarType());
    }
    return grads;
  }
};

} // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t width,
                                        int64_t vocab) {
  TORCH_CHECK(rows > 0 && width > 0 && vocab > 0,
              "lamp::ops::linear_cross_entropy_chunk_rows: rows, width and "
              "vocab must be positive, got ",
              rows, ", ", width, " and ", vocab, ".");
  if (vocab <= width) {
    return rows;
  }
  // Logits of about max(rows x width, vocab x width) elements: as large as
  // the input, and never smaller than the weight's FP32 gradient, which the
  // pass holds anyway. Smaller chunks would save little memory and cost a
  // pass over that gradient each (measured on the CPU: 64-row chunks of
  // GPT-2's vocabulary made a BF16 step 0.71x the unfused one).
  const double wanted =
      std::max(static_cast<double>(rows) * static_cast<double>(width) /
                   static_cast<double>(vocab),
               static_cast<double>(width));
  const auto tiles = static_cast<int64_t>(
      std::ceil(wanted / static_cast<double>(kRowMultiple)));
  return std::min(rows, std::max<int64_t>(1, tiles) * kRowMultiple);
}

torch::Tensor linear_cross_entropy(const torch::Tensor& input,
                                   const torch::Tensor& weight,
                                   const torch::Tensor& targets,
                                   const LinearCrossEntropyOptions& options) {
  TORCH_CHECK(options.chunk_rows() >= 0, kLinearCrossEntropyWho,
              ": chunk_rows must be >= 0 (0 picks it), got ",
              options.chunk_rows(), ".");
  const auto flat = rows_of(input, weight, targets, kLinearCrossEntropyWho);
  const auto compute = compute_dtype(input, weight);
  const int64_t rows = flat.second.numel();
  const int64_t chunk = options.chunk_rows() > 0
                            ? std::min(options.chunk_rows(), rows)
                            : linear_cross_entropy_chunk_rows(
                                  rows, weight.size(1), weight.size(0));
  // The products run in `compute` as given: autocast must not cast them
  // again (or cache 16-bit copies of the weight beyond this call).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const bool wants_grad = torch::GradMode::is_enabled() &&
                          (input.requires_grad() || weight.requires_grad());
  if (!wants_grad) {
    auto pass = chunked_pass(flat.first, weight, flat.second, chunk, compute,
                             /*gradients=*/false);
    return options.sum() ? pass.loss_sum : pass.loss_sum / pass.counted;
  }
  return LinearCrossEntropyFunction::apply(input, weight, flat.second, chunk,
                                           options.sum(), compute);
}

torch::Tensor linear_cross_entropy_reference(const torch::Tensor& input,
                                             const torch::Tensor& weight,
                                             const torch::Tensor& targets,
                                             bool sum) {
  const auto flat = rows_of(input, weight, targets,
                            "lamp::ops::linear_cross_entropy_reference");
  namespace F = torch::nn::functional;
  return F::cross_entropy(
      F::linear(flat.first, weight.to(flat.first.scalar_type()))
          .to(torch::kFloat),
      flat.second,
      F::CrossEntropyFuncOptions().reduction(
          sum ? F::CrossEntropyFuncOptions::reduction_t(torch::kSum)
              : F::CrossEntropyFuncOptions::reduction_t(torch::kMean)));
}

} // namespace ops
} // namespace lamp
