#include "lamp/ops/relu_max_pool.h"
#include "platform/differentiable_once.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace lamp {
namespace ops {
namespace {

// Window position (row-major, < 225) of each output's maximum, or kNoGrad
// where the pooled value is not positive (ReLU's backward zeroes it).
constexpr uint8_t kNoGrad = 255;
constexpr int64_t kMaxFusedKernel = 15;
// Planes handed to one thread at a time (a plane is H x W of one channel).
constexpr int64_t kPlaneGrain = 16;

// Loads and stores in the type ATen's max_pool2d compares in (float for
// the 16-bit types, exact), written so that the compiler can vectorise the
// k = 2 loops: BF16 <-> float are bit shifts (every value stored here was
// loaded from BF16, so the shift back is exact, NaN payloads included).
template <typename scalar_t>
struct Element {
  using acc_t = at::opmath_type<scalar_t>;
  static acc_t load(const scalar_t* p) { return static_cast<acc_t>(*p); }
  static void store(scalar_t* p, acc_t v) { *p = static_cast<scalar_t>(v); }
};

template <>
struct Element<c10::BFloat16> {
  using acc_t = float;
  static float load(const c10::BFloat16* p) {
    const uint32_t bits =
        static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16;
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  static void store(c10::BFloat16* p, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(bits >> 16);
  }
};

// ATen's CPU max_pool2d scan step: take `v` if strictly greater, or NaN.
// Branch-free, so that the k = 2 loops vectorise.
template <typename acc_t>
inline void scan(acc_t v, int position, acc_t& best, int& best_at) {
  const bool take = (v > best) | (v != v);
  best = take ? v : best;
  best_at = take ? position : best_at;
}

// One row of 2x2 windows: rows `r0` and `r1` of the input, `out_w` outputs.
template <typename scalar_t>
void forward_row_2x2(const scalar_t* __restrict r0,
                     const scalar_t* __restrict r1, int64_t out_w,
                     scalar_t* __restrict out, uint8_t* __restrict index) {
  using E = Element<scalar_t>;
  using acc_t = typename E::acc_t;
  for (int64_t ow = 0; ow < out_w; ++ow) {
    acc_t best = E::load(r0 + 2 * ow);
    int best_at = 0;
    scan(E::load(r0 + 2 * ow + 1), 1, best, best_at);
    scan(E::load(r1 + 2 * ow), 2, best, best_at);
    scan(E::load(r1 + 2 * ow + 1), 3, best, best_at);
    const bool passes = !(best <= acc_t(0)); // positive or NaN
    E::store(out + ow, passes ? best : acc_t(0));
    index[ow] = passes ? static_cast<uint8_t>(best_at) : kNoGrad;
  }
}

// One row of k x k windows starting at `in` (rows `width` apart).
template <typename scalar_t>
void forward_row(const scalar_t* in, int64_t width, int64_t out_w, int64_t k,
                 scalar_t* out, uint8_t* index) {
  using E = Element<scalar_t>;
  using acc_t = typename E::acc_t;
  for (int64_t ow = 0; ow < out_w; ++ow) {
    const scalar_t* window = in + ow * k;
    acc_t best = E::load(window);
    int best_at = 0;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        if (i + j > 0) {
          scan(E::load(window + i * width + j), static_cast<int>(i * k + j),
               best, best_at);
        }
      }
    }
    const bool passes = !(best <= acc_t(0));
    E::store(out + ow, passes ? best : acc_t(0));
    index[ow] = passes ? static_cast<uint8_t>(best_at) : kNoGrad;
  }
}

// Backward only moves gradient values or writes zeros, and +0.0 is all
// zero bits in every floating type: it runs on the raw bits (which also lets
// the compiler vectorise the 16-bit types).
template <size_t bytes>
struct Raw;
template <>
struct Raw<2> {
  using type = uint16_t;
};
template <>
struct Raw<4> {
  using type = uint32_t;
};
template <>
struct Raw<8> {
  using type = uint64_t;
};

template <typename raw_t>
void backward_row_2x2(const raw_t* __restrict grad_out,
                      const uint8_t* __restrict index, int64_t out_w,
                      raw_t* __restrict r0, raw_t* __restrict r1) {
  for (int64_t ow = 0; ow < out_w; ++ow) {
    const raw_t g = grad_out[ow];
    const uint8_t at = index[ow];
    r0[2 * ow] = at == 0 ? g : raw_t(0);
    r0[2 * ow + 1] = at == 1 ? g : raw_t(0);
    r1[2 * ow] = at == 2 ? g : raw_t(0);
    r1[2 * ow + 1] = at == 3 ? g : raw_t(0);
  }
}

template <typename raw_t>
void backward_row(const raw_t* grad_out, const uint8_t* index, int64_t width,
                  int64_t out_w, int64_t k, raw_t* grad_in) {
  for (int64_t ow = 0; ow < out_w; ++ow) {
    const raw_t g = grad_out[ow];
    const int at = index[ow];
    raw_t* window = grad_in + ow * k;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        window[i * width + j] =
            at == static_cast<int>(i * k + j) ? g : raw_t(0);
      }
    }
  }
}

#if defined(__SSE2__)
// The 2x2 rows for the two dtypes that matter (BF16, float) in SSE2, which
// every x86-64 CPU has: four windows per iteration, and the last iteration
// moved back to end at the row's end (it recomputes a few windows, which is
// harmless) so that short rows (7 and 14 outputs in the MNIST CNN) run no
// scalar tail. The compiler does not vectorise these loops by itself at
// such lengths; the scalar scan mispredicts a branch per element.
namespace simd {

inline __m128 select(__m128 mask, __m128 x, __m128 y) {
  return _mm_or_ps(_mm_and_ps(mask, x), _mm_andnot_ps(mask, y));
}

inline __m128i select(__m128i mask, __m128i x, __m128i y) {
  return _mm_or_si128(_mm_and_si128(mask, x), _mm_andnot_si128(mask, y));
}

inline void scan(__m128 v, int position, __m128& best, __m128i& best_at) {
  const __m128 take = _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v));
  best = select(take, v, best);
  best_at = select(_mm_castps_si128(take), _mm_set1_epi32(position), best_at);
}

// Four windows with elements a b / c d: the ReLU'd maximum and the window
// positions (kNoGrad where the maximum is not positive or NaN), as 4 bytes.
inline __m128 pool4(__m128 a, __m128 b, __m128 c, __m128 d, uint8_t* index) {
  __m128 best = a;
  __m128i best_at = _mm_setzero_si128();
  scan(b, 1, best, best_at);
  scan(c, 2, best, best_at);
  scan(d, 3, best, best_at);
  const __m128 passes = _mm_cmpnle_ps(best, _mm_setzero_ps());
  best_at = select(_mm_castps_si128(passes), best_at, _mm_set1_epi32(kNoGrad));
  best_at = _mm_packs_epi32(best_at, best_at);
  best_at = _mm_packus_epi16(best_at, best_at);
  const int32_t bytes = _mm_cvtsi128_si32(best_at);
  std::memcpy(index, &bytes, sizeof bytes);
  return _mm_and_ps(passes, best);
}

// Start of the group of four outputs at `ow`, moved back to end at out_w.
inline int64_t group_start(int64_t ow, int64_t out_w) {
  return ow + 4 <= out_w ? ow : out_w - 4;
}

// Four window positions as 16-bit lanes, each twice: p0 p0 p1 p1 p2 p2 p3 p3.
inline __m128i positions_x2_epi16(const uint8_t* index) {
  int32_t bytes;
  std::memcpy(&bytes, index, sizeof bytes);
  const __m128i at =
      _mm_unpacklo_epi8(_mm_cvtsi32_si128(bytes), _mm_setzero_si128());
  return _mm_unpacklo_epi16(at, at);
}

} // namespace simd

void forward_row_2x2(const float* __restrict r0, const float* __restrict r1,
                     int64_t out_w, float* __restrict out,
                     uint8_t* __restrict index) {
  if (out_w < 4) {
    forward_row_2x2<float>(r0, r1, out_w, out, index);
    return;
  }
  for (int64_t next = 0; next < out_w; next += 4) {
    const int64_t ow = simd::group_start(next, out_w);
    const __m128 t0 = _mm_loadu_ps(r0 + 2 * ow),
                 t1 = _mm_loadu_ps(r0 + 2 * ow + 4);
    const __m128 u0 = _mm_loadu_ps(r1 + 2 * ow),
                 u1 = _mm_loadu_ps(r1 + 2 * ow + 4);
    const __m128 a = _mm_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m128 b = _mm_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m128 c = _mm_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m128 d = _mm_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1));
    _mm_storeu_ps(out + ow, simd::pool4(a, b, c, d, index + ow));
  }
}

void forward_row_2x2(const c10::BFloat16* __restrict r0,
                     const c10::BFloat16* __restrict r1, int64_t out_w,
                     c10::BFloat16* __restrict out, uint8_t* __restrict index) {
  if (out_w < 4) {
    forward_row_2x2<c10::BFloat16>(r0, r1, out_w, out, index);
    return;
  }
  // Eight BF16 values a0 b0 a1 b1 ... are four 32-bit lanes (b << 16) | a:
  // the left elements as float are the lanes shifted left by 16, the right
  // ones the lanes with their low half cleared.
  const __m128i high = _mm_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t next = 0; next < out_w; next += 4) {
    const int64_t ow = simd::group_start(next, out_w);
    const __m128i t =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + 2 * ow));
    const __m128i u =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + 2 * ow));
    const __m128 best =
        simd::pool4(_mm_castsi128_ps(_mm_slli_epi32(t, 16)),
                    _mm_castsi128_ps(_mm_and_si128(t, high)),
                    _mm_castsi128_ps(_mm_slli_epi32(u, 16)),
                    _mm_castsi128_ps(_mm_and_si128(u, high)), index + ow);
    // The high halves back to BF16: an arithmetic shift keeps them within
    // int16, so the saturating pack copies them unchanged.
    __m128i bits = _mm_srai_epi32(_mm_castps_si128(best), 16);
    bits = _mm_packs_epi32(bits, bits);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + ow), bits);
  }
}

void backward_row_2x2(const uint16_t* __restrict grad_out,
                      const uint8_t* __restrict index, int64_t out_w,
                      uint16_t* __restrict r0, uint16_t* __restrict r1) {
  if (out_w < 4) {
    backward_row_2x2<uint16_t>(grad_out, index, out_w, r0, r1);
    return;
  }
  const __m128i top = _mm_setr_epi16(0, 1, 0, 1, 0, 1, 0, 1);
  const __m128i bottom = _mm_setr_epi16(2, 3, 2, 3, 2, 3, 2, 3);
  for (int64_t next = 0; next < out_w; next += 4) {
    const int64_t ow = simd::group_start(next, out_w);
    __m128i g =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(grad_out + ow));
    g = _mm_unpacklo_epi16(g, g);
    const __m128i at = simd::positions_x2_epi16(index + ow);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r0 + 2 * ow),
                     _mm_and_si128(_mm_cmpeq_epi16(at, top), g));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r1 + 2 * ow),
                     _mm_and_si128(_mm_cmpeq_epi16(at, bottom), g));
  }
}

void backward_row_2x2(const uint32_t* __restrict grad_out,
                      const uint8_t* __restrict index, int64_t out_w,
                      uint32_t* __restrict r0, uint32_t* __restrict r1) {
  if (out_w < 4) {
    backward_row_2x2<uint32_t>(grad_out, index, out_w, r0, r1);
    return;
  }
  const __m128i top = _mm_setr_epi32(0, 1, 0, 1);
  const __m128i bottom = _mm_setr_epi32(2, 3, 2, 3);
  for (int64_t next = 0; next < out_w; next += 4) {
    const int64_t ow = simd::group_start(next, out_w);
    const __m128i g =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(grad_out + ow));
    const __m128i g_lo = _mm_unpacklo_epi32(g, g),
                  g_hi = _mm_unpackhi_epi32(g, g);
    const __m128i at16 = simd::positions_x2_epi16(index + ow);
    const __m128i at_lo = _mm_unpacklo_epi16(at16, _mm_setzero_si128());
    const __m128i at_hi = _mm_unpackhi_epi16(at16, _mm_setzero_si128());
    auto* t = reinterpret_cast<__m128i*>(r0 + 2 * ow);
    auto* u = reinterpret_cast<__m128i*>(r1 + 2 * ow);
    _mm_storeu_si128(t, _mm_and_si128(_mm_cmpeq_epi32(at_lo, top), g_lo));
    _mm_storeu_si128(t + 1, _mm_and_si128(_mm_cmpeq_epi32(at_hi, top), g_hi));
    _mm_storeu_si128(u, _mm_and_si128(_mm_cmpeq_epi32(at_lo, bottom), g_lo));
    _mm_storeu_si128(u + 1,
                     _mm_and_si128(_mm_cmpeq_epi32(at_hi, bottom), g_hi));
  }
}
#endif // __SSE2__

template <typename scalar_t>
void forward_kernel(const torch::Tensor& input, torch::Tensor& output,
                    torch::Tensor& window_index, int64_t k) {
  const int64_t planes = input.size(0) * input.size(1);
  const int64_t height = input.size(2), width = input.size(3);
  const int64_t out_h = output.size(2), out_w = output.size(3);
  const scalar_t* in = input.data_ptr<scalar_t>();
  scalar_t* out = output.data_ptr<scalar_t>();
  uint8_t* index = window_index.data_ptr<uint8_t>();
  at::parallel_for(0, planes, kPlaneGrain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t oh = 0; oh < out_h; ++oh) {
        const scalar_t* row = in + (p * height + oh * k) * width;
        const int64_t o = (p * out_h + oh) * out_w;
        if (k == 2) {
          forward_row_2x2(row, row + width, out_w, out + o, index + o);
        } else {
          forward_row(row, width, out_w, k, out + o, index + o);
        }
      }
    }
  });
}

template <typename raw_t>
void backward_kernel(const torch::Tensor& grad_output,
                     const torch::Tensor& window_index,
                     torch::Tensor& grad_input, int64_t k) {
  const int64_t planes = grad_input.size(0) * grad_input.size(1);
  const int64_t height = grad_input.size(2), width = grad_input.size(3);
  const int64_t out_h = grad_output.size(2), out_w = grad_output.size(3);
  const auto* grad_out = static_cast<const raw_t*>(grad_output.data_ptr());
  const uint8_t* index = window_index.data_ptr<uint8_t>();
  auto* grad_in = static_cast<raw_t*>(grad_input.data_ptr());
  at::parallel_for(0, planes, kPlaneGrain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      raw_t* plane = grad_in + p * height * width;
      // Every element is written once: the windows, then the columns and
      // rows that floor mode leaves out.
      for (int64_t oh = 0; oh < out_h; ++oh) {
        raw_t* row = plane + oh * k * width;
        const int64_t o = (p * out_h + oh) * out_w;
        if (k == 2) {
          backward_row_2x2(grad_out + o, index + o, out_w, row, row + width);
        } else {
          backward_row(grad_out + o, index + o, width, out_w, k, row);
        }
        for (int64_t i = 0; i < k; ++i) {
          std::fill(row + i * width + out_w * k, row + (i + 1) * width,
                    raw_t(0));
        }
      }
      std::fill(plane + out_h * k * width, plane + height * width, raw_t(0));
    }
  });
}

struct ReluMaxPool2d : public torch::autograd::Function<ReluMaxPool2d> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& input, int64_t k) {
    auto output = torch::empty(
        {input.size(0), input.size(1), input.size(2) / k, input.size(3) / k},
        input.options());
    auto window_index =
        torch::empty(output.sizes(), input.options().dtype(torch::kUInt8));
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, input.scalar_type(), "relu_max_pool2d",
        [&] { forward_kernel<scalar_t>(input, output, window_index, k); });
    ctx->save_for_backward({window_index});
    ctx->saved_data["kernel_size"] = k;
    ctx->saved_data["input_sizes"] = input.sizes().vec();
    return output;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    const auto& grad = grad_outputs[0];
    lamp::detail::refuse_higher_order_gradients(
        "lamp::ops::relu_max_pool2d",
        "torch::max_pool2d(torch::relu(x), {k, k}) gives them.");
    const auto window_index = ctx->get_saved_variables()[0];
    const int64_t k = ctx->saved_data["kernel_size"].toInt();
    const auto sizes = ctx->saved_data["input_sizes"].toIntVector();
    const auto grad_output = grad.contiguous();
    auto grad_input = torch::empty(sizes, grad_output.options());
    switch (grad_output.element_size()) {
      case 2:
        backward_kernel<Raw<2>::type>(grad_output, window_index, grad_input, k);
        break;
      case 4:
        backward_kernel<Raw<4>::type>(grad_output, window_index, grad_input, k);
        break;
      default:
        TORCH_INTERNAL_ASSERT(grad_output.element_size() == 8);
        backward_kernel<Raw<8>::type>(grad_output, window_index, grad_input, k);
    }
    return {grad_input, torch::Tensor()};
  }
};

} // namespace

bool relu_max_pool2d_is_fused(const torch::Tensor& input, int64_t kernel_size) {
  const auto dtype = input.scalar_type();
  return input.defined() && input.device().is_cpu() && input.dim() == 4 &&
         input.is_contiguous() && !input.is_sparse() &&
         (dtype == torch::kFloat || dtype == torch::kDouble ||
          dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
         kernel_size >= 1 && kernel_size <= kMaxFusedKernel &&
         input.size(2) >= kernel_size && input.size(3) >= kernel_size;
}

namespace detail {

std::vector<torch::Tensor> relu_max_pool2d_saved_tensors(
    const torch::Tensor& output) {
  const auto* node =
      dynamic_cast<const torch::autograd::CppNode<ReluMaxPool2d>*>(
          output.defined() ? output.grad_fn().get() : nullptr);
  if (node == nullptr) {
    return {};
  }
  return node->ctx_.get_saved_variables();
}

} // namespace detail

torch::Tensor relu_max_pool2d(const torch::Tensor& input, int64_t kernel_size) {
  TORCH_CHECK(input.defined(),
              "lamp::ops::relu_max_pool2d: the input is an undefined tensor.");
  TORCH_CHECK(
      kernel_size >= 1,
      "lamp::ops::relu_max_pool2d: kernel_size must be at least 1, got ",
      kernel_size, ".");
  if (!relu_max_pool2d_is_fused(input, kernel_size)) {
    return torch::max_pool2d(torch::relu(input), {kernel_size, kernel_size});
  }
  return ReluMaxPool2d::apply(input, kernel_size);
}

} // namespace ops
} // namespace lamp
