#include "lamp/nn/attention.h"

#include <ATen/record_function.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nn/math_attention.h"
#include "platform/compat.h"

namespace lamp {
namespace detail {

torch::Tensor math_attention(const torch::Tensor& query,
                             const torch::Tensor& key,
                             const torch::Tensor& value,
                             const torch::Tensor& attn_mask, double dropout_p,
                             bool is_causal) {
  // Named for lamp::op_precision_report (and profilers): the attention
  // backend that ran, with its input's dtype.
  RECORD_FUNCTION("lamp::math_attention", std::vector<c10::IValue>({query}));
  const auto wide =
      query.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const double scale = 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
  auto scores = torch::matmul(query, key.transpose(-2, -1)).to(wide) * scale;
  const auto minus_inf = -std::numeric_limits<double>::infinity();
  if (is_causal) {
    const auto keep = torch::ones({query.size(-2), key.size(-2)},
                                  scores.options().dtype(torch::kBool))
                          .tril();
    scores = scores.masked_fill(keep.logical_not(), minus_inf);
  } else if (attn_mask.defined()) {
    scores = attn_mask.scalar_type() == torch::kBool
                 ? scores.masked_fill(attn_mask.logical_not(), minus_inf)
                 : scores + attn_mask.to(wide);
  }
  torch::Tensor weights;
  if (attn_mask.defined()) {
    // A query whose every key is masked (a padded row) attends to nothing:
    // zero weights, as Python's math path gives them (at::_safe_softmax),
    // not a softmax of -infs, whose NaNs would also reach every gradient
    // through the backward. Its scores are zeroed first, so that no NaN
    // arises in either pass. (A causal mask keeps each query's first key.)
    const auto masked_row = (scores == minus_inf).all(-1, /*keepdim=*/true);
    weights = torch::softmax(scores.masked_fill(masked_row, 0.0), -1)
                  .masked_fill(masked_row, 0.0);
  } else {
    weights = torch::softmax(scores, -1);
  }
  weights = weights.to(value.scalar_type());
  if (dropout_p > 0) {
    weights = torch::dropout(weights, dropout_p, /*train=*/true);
  }
  return torch::matmul(weights, value);
}

} // namespace detail

namespace nn {
namespace {

constexpr SdpaBackend kAllBackends[] = {
    SdpaBackend::kFlash, SdpaBackend::kMemoryEfficient, SdpaBackend::kCuDNN,
    SdpaBackend::kMath};

int index_of(SdpaBackend backend) {
  return static_cast<int>(backend);
}

// Whether the leading sizes of `a` broadcast against those of `b`,
// aligned from the right (the last `skip` sizes of each left out).
bool leading_broadcast(c10::IntArrayRef a, c10::IntArrayRef b, size_t skip) {
  const size_t na = a.size() - std::min(skip, a.size());
  const size_t nb = b.size() - std::min(skip, b.size());
  for (size_t i = 1; i <= std::min(na, nb); ++i) {
    const int64_t x = a[na - i], y = b[nb - i];
    if (x != y && x != 1 && y != 1) {
      return false;
    }
  }
  return true;
}

} // namespace

std::string to_string(SdpaBackend backend) {
  switch (backend) {
    case SdpaBackend::kFlash:
      return "flash";
    case SdpaBackend::kMemoryEfficient:
      return "memory-efficient";
    case SdpaBackend::kCuDNN:
      return "cudnn";
    case SdpaBackend::kMath:
      return "math";
  }
  return "unknown";
}

SdpaBackend parse_sdpa_backend(const std::string& name) {
  for (const auto backend : kAllBackends) {
    if (to_string(backend) == name) {
      return backend;
    }
  }
  TORCH_CHECK(false,
              "lamp::nn::parse_sdpa_backend: unknown attention backend '", name,
              "'; use flash, memory-efficient, cudnn or math.");
}

std::vector<SdpaBackend> enabled_sdpa_backends() {
  std::vector<SdpaBackend> enabled;
  for (const auto backend : kAllBackends) {
    if (lamp::detail::sdp_backend_exists(index_of(backend)) &&
        lamp::detail::sdp_backend_enabled(index_of(backend))) {
      enabled.push_back(backend);
    }
  }
  return enabled;
}

SdpaBackendGuard::SdpaBackendGuard(const std::vector<SdpaBackend>& backends) {
  TORCH_CHECK(!backends.empty(),
              "lamp::nn::SdpaBackendGuard: give at least one backend; with "
              "none, scaled_dot_product_attention could not run.");
  for (const auto backend : backends) {
    TORCH_CHECK(lamp::detail::sdp_backend_exists(index_of(backend)),
                "lamp::nn::SdpaBackendGuard: this LibTorch (", TORCH_VERSION,
                ") has no '", to_string(backend), "' attention backend; ",
                fused_attention_available()
                    ? "cuDNN's needs LibTorch 2.3 or later."
                    : "LibTorch 1.13 has only the math formula "
                      "(SdpaBackend::kMath).");
  }
  for (const auto backend : kAllBackends) {
    const int i = index_of(backend);
    previous_.push_back(lamp::detail::sdp_backend_exists(i) &&
                        lamp::detail::sdp_backend_enabled(i));
  }
  for (const auto backend : kAllBackends) {
    const int i = index_of(backend);
    if (lamp::detail::sdp_backend_exists(i)) {
      bool wanted = false;
      for (const auto b : backends) {
        wanted = wanted || b == backend;
      }
      lamp::detail::set_sdp_backend_enabled(i, wanted);
    }
  }
}

SdpaBackendGuard::~SdpaBackendGuard() {
  for (const auto backend : kAllBackends) {
    const int i = index_of(backend);
    if (lamp::detail::sdp_backend_exists(i)) {
      const bool was_enabled = previous_[static_cast<size_t>(i)];
      lamp::detail::set_sdp_backend_enabled(i, was_enabled);
    }
  }
}

bool fused_attention_available() {
  return lamp::detail::FusedAttention::available;
}

torch::Tensor scaled_dot_product_attention(const torch::Tensor& query,
                                           const torch::Tensor& key,
                                           const torch::Tensor& value,
                                           const torch::Tensor& attn_mask,
                                           double dropout_p, bool is_causal) {
  constexpr const char* kWho = "lamp::nn::scaled_dot_product_attention";
  TORCH_CHECK(query.defined() && key.defined() && value.defined() &&
                  query.dim() >= 2 && key.dim() == query.dim() &&
                  value.dim() == query.dim(),
              kWho,
              ": query, key and value must be tensors of the same rank, at "
              "least 2 ([..., L, E], [..., S, E], [..., S, Ev]).");
  TORCH_CHECK(query.size(-1) == key.size(-1) && key.size(-2) == value.size(-2),
              kWho, ": query ", query.sizes(), ", key ", key.sizes(),
              " and value ", value.sizes(),
              " do not fit: the query's and key's last sizes must be equal "
              "(E), and the key's and value's second-to-last (S).");
  TORCH_CHECK(query.size(-1) > 0, kWho, ": query ", query.sizes(),
              " has heads of size 0 (E); the scale 1 / sqrt(E) is then "
              "infinite. Give heads of at least one value.");
  TORCH_CHECK(leading_broadcast(query.sizes(), key.sizes(), 2) &&
                  leading_broadcast(query.sizes(), value.sizes(), 2) &&
                  leading_broadcast(key.sizes(), value.sizes(), 2),
              kWho, ": query ", query.sizes(), ", key ", key.sizes(),
              " and value ", value.sizes(),
              " differ in their leading sizes (batch, heads); give the key "
              "and value as many heads as the query (grouped keys repeated "
              "with repeat_interleave over the heads' dimension).");
  if (attn_mask.defined()) {
    const auto dtype = attn_mask.scalar_type();
    TORCH_CHECK(dtype == torch::kBool || dtype == torch::kFloat ||
                    dtype == query.scalar_type(),
                kWho,
                ": attn_mask must be bool (true: attend), FP32 or the "
                "query's dtype (",
                query.scalar_type(),
                ", added to the "
                "scores), got ",
                dtype, ".");
    const int64_t l = query.size(-2), s = key.size(-2);
    const auto m = attn_mask.sizes();
    const bool fits =
        attn_mask.dim() <= query.dim() &&
        (attn_mask.dim() < 1 || m.back() == s || m.back() == 1) &&
        (attn_mask.dim() < 2 || m[m.size() - 2] == l || m[m.size() - 2] == 1) &&
        leading_broadcast(m, query.sizes(), 2);
    TORCH_CHECK(fits, kWho, ": attn_mask ", m,
                " does not broadcast to the "
                "scores [..., L, S] = [..., ",
                l, ", ", s, "] of query ", query.sizes(), " and key ",
                key.sizes(),
                "; give it as [L, S] "
                "or [B, heads or 1, L, S].");
  }
  TORCH_CHECK(!(is_causal && attn_mask.defined()), kWho,
              ": is_causal and attn_mask exclude each other; fold the causal "
              "mask into attn_mask.");
  TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, kWho,
              ": dropout_p must be in [0, 1), got ", dropout_p, ".");
  if (lamp::detail::FusedAttention::available) {
    return lamp::detail::FusedAttention::run(
        query, key, value,
        attn_mask.defined() ? c10::optional<at::Tensor>(attn_mask)
                            : c10::nullopt,
        dropout_p, is_causal);
  }
  return lamp::detail::math_attention(query, key, value, attn_mask, dropout_p,
                                      is_causal);
}

} // namespace nn
} // namespace lamp
