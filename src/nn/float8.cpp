#include "lamp/nn/float8.h"

#include <torch/torch.h>

#include <cmath>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "lamp/nn/linear.h"
#include "lamp/platform/hardware.h"
#include "platform/compat.h"

namespace lamp {
namespace nn {
namespace {

constexpr const char* kStateName = "float8";
constexpr int64_t kOperands = 3;
const char* const kOperandNames[kOperands] = {"input", "weight", "grad_output"};
// Rows of Float8StateImpl::counters.
constexpr int64_t kSaturated = 0;
constexpr int64_t kNonFinite = 1;
constexpr int64_t kLastScale = 2;
constexpr int64_t kCasts = 3;
// torchao's floor under an amax (float8_utils.EPS): an all-zero tensor gets
// a finite scale.
constexpr double kAmaxFloor = 1e-12;

const char* scaling_name(Float8Scaling scaling) {
  return scaling == Float8Scaling::kCurrent ? "current" : "delayed";
}

void check_recipe(const Float8Recipe& recipe, const std::string& who) {
  TORCH_CHECK(recipe.scaling() == Float8Scaling::kCurrent ||
                  recipe.scaling() == Float8Scaling::kDelayed,
              who, ": unknown Float8Scaling value.");
  TORCH_CHECK(recipe.amax_compute() == Float8AmaxCompute::kMax ||
                  recipe.amax_compute() == Float8AmaxCompute::kMostRecent,
              who, ": unknown Float8AmaxCompute value.");
  TORCH_CHECK(recipe.amax_history_len() >= 1, who,
              ": amax_history_len must be at least 1, got ",
              recipe.amax_history_len(), ".");
  TORCH_CHECK(
      recipe.margin() >= 0 && recipe.margin() <= 64, who,
      ": margin must be in [0, 64] (the scale is max / amax / 2^margin), got ",
      recipe.margin(), ".");
}

Float8StateImpl* state_of(const torch::nn::Module& layer) {
  for (const auto& child : layer.named_children()) {
    if (child.key() == kStateName) {
      return dynamic_cast<Float8StateImpl*>(child.value().get());
    }
  }
  return nullptr;
}

// `model`'s modules with their names, `model` itself first (as ""):
// named_modules() can list the top module only when it is held by a
// shared_ptr.
std::vector<std::pair<std::string, torch::nn::Module*>> modules_of(
    const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{
      {"", const_cast<torch::nn::Module*>(&model)}};
  for (const auto& item :
       model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  return modules;
}

// Every converted layer of `model`, in named_modules() order.
std::vector<Float8StateImpl*> states_of(const torch::nn::Module& model) {
  std::vector<Float8StateImpl*> states;
  for (const auto& item : modules_of(model)) {
    if (auto* state = dynamic_cast<Float8StateImpl*>(item.second)) {
      states.push_back(state);
    }
  }
  return states;
}

bool is_low_precision(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

using Holders = std::unordered_map<const void*, int>;

// How many modules hold each parameter: a weight shared with another module
// (tied embeddings) stays out of FP8.
Holders holders_of(
    const std::vector<std::pair<std::string, torch::nn::Module*>>& modules) {
  Holders holders;
  for (const auto& item : modules) {
    for (const auto& p : item.second->named_parameters(/*recurse=*/false)) {
      ++holders[p.value().unsafeGetTensorImpl()];
    }
  }
  return holders;
}

// Why `layer` cannot compute in FP8 ("" when it can): what
// convert_to_float8() and float8_left_out() say of it.
std::string ineligible_reason(const torch::nn::LinearImpl& layer,
                              const Holders& holders) {
  const auto& weight = layer.weight;
  const int64_t out = weight.size(0), in = weight.size(1);
  if (!(weight.scalar_type() == torch::kFloat ||
        is_low_precision(weight.scalar_type()))) {
    return std::string("its weight is ") + c10::toString(weight.scalar_type()) +
           "; FP8 layers take FP32, BF16 or FP16 weights";
  }
  if (in % 16 != 0 || out % 16 != 0) {
    return "its weight is [" + std::to_string(out) + ", " + std::to_string(in) +
           "]; CUDA's FP8 products need in and out features that are "
           "multiples of 16";
  }
  const auto found = holders.find(weight.unsafeGetTensorImpl());
  if (found != holders.end() && found->second > 1) {
    return "its weight is shared with another module (tied); it would be "
           "cast once per use";
  }
  return "";
}

} // namespace

Float8StateImpl::Float8StateImpl(Float8Recipe recipe, std::string name)
    : recipe_(recipe), name_(std::move(name)) {
  check_recipe(recipe_, "lamp::nn::Float8State");
  reset();
}

void Float8StateImpl::reset() {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  scale = torch::ones({kOperands}, f32);
  amax_history =
      torch::zeros({kOperands, recipe_.scaling() == Float8Scaling::kDelayed
                                   ? recipe_.amax_history_len()
                                   : 1},
                   f32);
  pending_amax = torch::zeros({kOperands}, f32);
  counters = torch::zeros({4, kOperands}, f32);
  counters[kLastScale].fill_(1.0);
}

void Float8StateImpl::to(torch::Device device, torch::Dtype /*dtype*/,
                         bool non_blocking) {
  // The state stays FP32 whatever the model is converted to.
  to(device, non_blocking);
}

void Float8StateImpl::to(torch::Dtype /*dtype*/, bool /*non_blocking*/) {}

void Float8StateImpl::to(torch::Device device, bool non_blocking) {
  scale = scale.to(device, non_blocking);
  amax_history = amax_history.to(device, non_blocking);
  pending_amax = pending_amax.to(device, non_blocking);
  counters = counters.to(device, non_blocking);
}

Float8StateImpl* float8_state(const torch::nn::LinearImpl& layer) {
  return state_of(layer);
}

bool has_float8_layers(const torch::nn::Module& model) {
  return !states_of(model).empty();
}

std::vector<std::pair<std::string, std::string>> float8_left_out(
    const torch::nn::Module& model) {
  const auto modules = modules_of(model);
  const auto holders = holders_of(modules);
  std::vector<std::pair<std::string, std::string>> left_out;
  for (const auto& item : modules) {
    const auto* linear =
        dynamic_cast<const torch::nn::LinearImpl*>(item.second);
    if (linear == nullptr || state_of(*linear) != nullptr) {
      continue;
    }
    std::string why = ineligible_reason(*linear, holders);
    left_out.emplace_back(item.first, why.empty()
                                          ? "left out by the conversion's "
                                            "predicate (eligible otherwise)"
                                          : std::move(why));
  }
  return left_out;
}

namespace detail {

double float8_max(torch::Dtype dtype) {
#if LAMP_TORCH_FLOAT8
  if (dtype == c10::ScalarType::Float8_e4m3fn) {
    return 448.0;
  }
  if (dtype == c10::ScalarType::Float8_e5m2) {
    return 57344.0;
  }
#endif
  TORCH_CHECK(false, "lamp::nn::float8: ", dtype,
              " is not an FP8 format lamp casts to (E4M3 or E5M2).");
}

torch::Tensor amax_to_scale(const torch::Tensor& amax, double max,
                            int64_t margin) {
  return (max / std::ldexp(1.0, static_cast<int>(margin))) /
         amax.to(torch::kFloat).clamp_min(kAmaxFloor);
}

torch::Tensor cast_to_float8(const torch::Tensor& t, const torch::Tensor& scale,
                             torch::Dtype dtype, bool saturate) {
  const double max = float8_max(dtype);
  // The scale as a one-element 1-D tensor: it then takes part in type
  // promotion (a 0-D one would not), so a BF16 or FP16 `t` is widened to
  // FP32 inside the multiplication's kernel instead of by a copy of its
  // own, and the product is never rounded to 16 bits. The product is a new
  // FP32 tensor (never `t` itself), clamped in place: a value past the range
  // becomes +-max (saturation), never a NaN, whatever the LibTorch's
  // conversion does with it.
  auto scaled = t * scale.to(torch::kFloat).reshape({1});
  if (saturate) {
    scaled.clamp_(-max, max);
  }
  return scaled.to(dtype);
}

void check_scaled_mm_operands(const torch::Tensor& a, const torch::Tensor& b,
                              const std::string& layer,
                              const std::string& product) {
  const auto where = [&] {
    return "lamp::nn::float8_linear: layer '" + layer + "', " + product + ": ";
  };
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, where(),
              "both operands must be matrices, got ", a.sizes(), " and ",
              b.sizes(), ".");
  TORCH_CHECK(a.size(1) == b.size(0), where(), "the shapes ", a.sizes(),
              " and ", b.sizes(), " do not multiply.");
#if LAMP_TORCH_FLOAT8
  const auto is_fp8 = [](const torch::Tensor& t) {
    return t.scalar_type() == c10::ScalarType::Float8_e4m3fn ||
           t.scalar_type() == c10::ScalarType::Float8_e5m2;
  };
  TORCH_CHECK(is_fp8(a) && is_fp8(b), where(),
              "both operands must be E4M3 or E5M2, got ", a.scalar_type(),
              " and ", b.scalar_type(), ".");
  TORCH_CHECK(!(a.scalar_type() == c10::ScalarType::Float8_e5m2 &&
                b.scalar_type() == c10::ScalarType::Float8_e5m2),
              where(),
              "E5M2 x E5M2 is not a product CUDA's _scaled_mm runs; one "
              "operand must be E4M3.");
#endif
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TORCH_CHECK(m % 16 == 0 && k % 16 == 0 && n % 16 == 0, where(),
              "CUDA's _scaled_mm needs every dimension a multiple of 16, got [",
              m, ", ", k, "] x [", k, ", ", n,
              "]; keep this layer out of convert_to_float8 (its predicate) or "
              "give it sizes that are multiples of 16.");
  TORCH_CHECK(a.stride(1) == 1 && a.stride(0) == k, where(),
              "the first operand must be row-major, got strides ", a.strides(),
              " for ", a.sizes(), ".");
  TORCH_CHECK(b.stride(0) == 1 && b.stride(1) == k, where(),
              "the second operand must be column-major, got strides ",
              b.strides(), " for ", b.sizes(), ".");
}

} // namespace detail

std::string float8_unavailable_reason(const torch::Device& device) {
#if !LAMP_TORCH_FLOAT8
  (void)device;
  return "this LibTorch (" TORCH_VERSION
         ") has no float8 types or _scaled_mm; FP8 training needs LibTorch "
         "2.5 or newer (the torch wheel's)";
#else
  if (device.is_cuda()) {
    const auto gpu = device_capabilities(device);
    if (gpu.sm() < 89) {
      std::ostringstream s;
      s << device << " (" << gpu.name << ") has compute capability "
        << gpu.compute_major << "." << gpu.compute_minor
        << "; FP8 matrix products need 8.9 (Ada) or newer (Hopper, "
           "Blackwell)";
      return s.str();
    }
    return "";
  }
  TORCH_CHECK(device.is_cpu(), "lamp::nn::float8: device ", device,
              " is not supported; use a CPU or a CUDA device.");
  // The CPU _scaled_mm (an emulation, for testing) came after the float8
  // types; asked once per process.
  static const std::string cpu_reason = [] {
    try {
      const auto a = torch::zeros({16, 16}).to(c10::ScalarType::Float8_e4m3fn);
      const auto one = torch::ones({});
      at::_scaled_mm(a, a.t(), one, one, c10::nullopt, c10::nullopt,
                     torch::kFloat);
      return std::string();
    } catch (const c10::Error&) {
      return std::string("this LibTorch (" TORCH_VERSION
                         ") has no CPU _scaled_mm to emulate FP8 products "
                         "with; use a CUDA GPU of compute capability 8.9 or "
                         "newer, or a newer LibTorch");
    }
  }();
  return cpu_reason;
#endif
}

#if LAMP_TORCH_FLOAT8
namespace {

int64_t round_up_16(int64_t n) {
  return (n + 15) / 16 * 16;
}

constexpr auto kE4M3 = c10::ScalarType::Float8_e4m3fn;
constexpr auto kE5M2 = c10::ScalarType::Float8_e5m2;

// One operand cast for a product: its FP8 data and the factor that undoes
// its scale (what _scaled_mm multiplies the product by).
struct Cast {
  torch::Tensor data;
  torch::Tensor inverse_scale;
};

// The tensors of a layer's state that a cast reads and writes. Views of
// Float8StateImpl's tensors (writes land there), kept in the autograd
// context for the backward's cast of dY.
struct OperandState {
  torch::Tensor scale;        // [] the scale of delayed scaling
  torch::Tensor pending_amax; // []
  torch::Tensor saturated;    // []
  torch::Tensor non_finite;   // []
  torch::Tensor last_scale;   // []
  torch::Tensor casts;        // []
};

OperandState operand_state(Float8StateImpl& state, int64_t operand) {
  return {state.scale[operand],
          state.pending_amax[operand],
          state.counters[kSaturated][operand],
          state.counters[kNonFinite][operand],
          state.counters[kLastScale][operand],
          state.counters[kCasts][operand]};
}

// Casts `t` with its operand's scale, recording its amax: no value leaves
// the device.
Cast cast_operand(const torch::Tensor& t, const OperandState& s, bool delayed,
                  int64_t margin, torch::Dtype dtype) {
  const double max = detail::float8_max(dtype);
  // max |t| = max(-min t, max t): one pass over t with no |t| temporary,
  // exact in t's dtype, NaN propagating as with abs().amax(). (On LibTorch
  // 2.15's CPU, aminmax takes a third of abs().amax()'s time, and
  // linalg_vector_norm(t, inf) ten times it.)
  const auto extrema = torch::aminmax(t);
  const auto amax =
      torch::maximum(std::get<0>(extrema).neg(), std::get<1>(extrema))
          .to(torch::kFloat);
  const auto finite = torch::isfinite(amax);
  s.non_finite.add_(finite.logical_not());
  torch::Tensor scale;
  if (delayed) {
    scale = s.scale;
    s.pending_amax.copy_(torch::where(
        finite, torch::maximum(s.pending_amax, amax), s.pending_amax));
    s.saturated.add_(torch::logical_and(finite, amax * scale > max));
  } else {
    scale = detail::amax_to_scale(amax, max, margin);
  }
  s.last_scale.copy_(scale);
  s.casts.add_(1);
  // A scale from t's own amax cannot take a value past the range: no clamp
  // (a pass over t fewer). Delayed scales come from earlier amaxes.
  return {detail::cast_to_float8(t, scale, dtype, /*saturate=*/delayed),
          scale.reciprocal()};
}

torch::Tensor pad_rows(const torch::Tensor& t2d, int64_t rows) {
  if (t2d.size(0) == rows) {
    return t2d;
  }
  return torch::constant_pad_nd(t2d, {0, 0, 0, rows - t2d.size(0)}, 0.0);
}

// a (row-major) x b (column-major) in FP8, after CUDA's rules.
torch::Tensor scaled_mm(const Cast& a, const Cast& b, torch::Dtype out_dtype,
                        const torch::Tensor& bias, bool fast_accum,
                        const std::string& layer, const std::string& product) {
  detail::check_scaled_mm_operands(a.data, b.data, layer, product);
  c10::optional<torch::Tensor> bias_arg;
  if (bias.defined()) {
    bias_arg = bias;
  }
  return at::_scaled_mm(a.data, b.data, a.inverse_scale, b.inverse_scale,
                        bias_arg, c10::nullopt, out_dtype, fast_accum);
}

class Float8LinearFunction
    : public torch::autograd::Function<Float8LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& input,
                               const torch::Tensor& weight,
                               const torch::Tensor& bias,
                               Float8StateImpl* state, torch::Dtype out_dtype) {
    const bool delayed = state->recipe().scaling() == Float8Scaling::kDelayed;
    const int64_t margin = state->recipe().margin();
    const int64_t k = weight.size(1), n = weight.size(0);
    const int64_t m = input.numel() / k;
    const auto x2d = pad_rows(input.reshape({m, k}), round_up_16(m));
    const auto x =
        cast_operand(x2d, operand_state(*state, 0), delayed, margin, kE4M3);
    const auto w =
        cast_operand(weight, operand_state(*state, 1), delayed, margin, kE4M3);
    // No bias: an empty tensor (autograd's inputs must be defined).
    const bool has_bias = bias.numel() > 0;
    // CUDA takes a bias with a 16-bit output only; an FP32 one is added
    // after.
    const bool fused_bias = has_bias && is_low_precision(out_dtype);
    auto y = scaled_mm(x, {w.data.t(), w.inverse_scale}, out_dtype,
                       fused_bias ? bias.to(out_dtype) : torch::Tensor(),
                       /*fast_accum=*/true, state->name(), "Y = X W^T");
    if (has_bias && !fused_bias) {
      y = y + bias.to(out_dtype);
    }
    ctx->save_for_backward({x.data, x.inverse_scale, w.data, w.inverse_scale});
    const auto g = operand_state(*state, 2);
    ctx->saved_data["g_scale"] = g.scale;
    ctx->saved_data["g_pending"] = g.pending_amax;
    ctx->saved_data["g_saturated"] = g.saturated;
    ctx->saved_data["g_non_finite"] = g.non_finite;
    ctx->saved_data["g_last_scale"] = g.last_scale;
    ctx->saved_data["g_casts"] = g.casts;
    ctx->saved_data["delayed"] = delayed;
    ctx->saved_data["margin"] = margin;
    ctx->saved_data["m"] = m;
    ctx->saved_data["name"] = state->name();
    ctx->saved_data["input_dtype"] = input.scalar_type();
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["bias_dtype"] = bias.scalar_type();
    std::vector<int64_t> out_shape(input.sizes().begin(), input.sizes().end());
    out_shape.back() = n;
    return y.narrow(0, 0, m).view(out_shape);
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const Cast x{saved[0], saved[1]};
    const Cast w{saved[2], saved[3]};
    const auto& d = ctx->saved_data;
    const OperandState g{
        d.at("g_scale").toTensor(),      d.at("g_pending").toTensor(),
        d.at("g_saturated").toTensor(),  d.at("g_non_finite").toTensor(),
        d.at("g_last_scale").toTensor(), d.at("g_casts").toTensor()};
    const bool delayed = d.at("delayed").toBool();
    const int64_t margin = d.at("margin").toInt();
    const int64_t m = d.at("m").toInt();
    const auto name = d.at("name").toStringRef();
    const auto input_dtype = d.at("input_dtype").toScalarType();
    const auto weight_dtype = d.at("weight_dtype").toScalarType();
    const int64_t n = w.data.size(0), k = w.data.size(1);
    const auto& grad = grad_outputs[0];
    const auto dy2d = pad_rows(grad.reshape({m, n}), x.data.size(0));
    const auto dy = cast_operand(dy2d, g, delayed, margin, kE5M2);
    torch::autograd::variable_list grads(5);
    if (ctx->needs_input_grad(0)) {
      // dX = dY W: W [n, k] as the column-major second operand.
      const Cast w_col{w.data.t().contiguous().t(), w.inverse_scale};
      auto dx = scaled_mm(dy, w_col, input_dtype, {}, /*fast_accum=*/false,
                          name, "dX = dY W");
      std::vector<int64_t> in_shape(grad.sizes().begin(), grad.sizes().end());
      in_shape.back() = k;
      grads[0] = dx.narrow(0, 0, m).view(in_shape);
    }
    if (ctx->needs_input_grad(1)) {
      // dW = dY^T X: dY^T row-major, X column-major.
      const Cast dy_t{dy.data.t().contiguous(), dy.inverse_scale};
      const Cast x_col{x.data.t().contiguous().t(), x.inverse_scale};
      grads[1] = scaled_mm(dy_t, x_col, weight_dtype, {}, /*fast_accum=*/false,
                           name, "dW = dY^T X");
    }
    if (d.at("has_bias").toBool() && ctx->needs_input_grad(2)) {
      grads[2] = grad.reshape({m, n})
                     .sum(0, /*keepdim=*/false, torch::kFloat)
                     .to(d.at("bias_dtype").toScalarType());
    }
    return grads;
  }
};

} // namespace
#endif // LAMP_TORCH_FLOAT8

torch::Tensor float8_linear(const torch::Tensor& input,
                            const torch::Tensor& weight,
                            const torch::Tensor& bias, Float8StateImpl& state) {
  const std::string who =
      "lamp::nn::float8_linear: layer '" + state.name() + "'";
  detail::check_linear_arguments(input, weight, bias, who);
  for (const auto* t : {&input, &weight}) {
    TORCH_CHECK(
        t->scalar_type() == torch::kFloat || is_low_precision(t->scalar_type()),
        who, ": FP8 layers take FP32, BF16 or FP16 inputs and weights, got ",
        t->scalar_type(), ".");
  }
  TORCH_CHECK(input.device() == weight.device() &&
                  state.scale.device() == weight.device(),
              who, ": the input (", input.device(), "), the weight (",
              weight.device(), ") and the FP8 state (", state.scale.device(),
              ") must be on one device; move the model with model->to(device) "
              "after convert_to_float8.");
  const auto reason = float8_unavailable_reason(input.device());
  TORCH_CHECK(reason.empty(), who, ": FP8 cannot run: ", reason, ".");
#if LAMP_TORCH_FLOAT8
  const auto device_type = input.device().type();
  const auto out_dtype = lamp::detail::autocast_enabled(device_type)
                             ? lamp::detail::autocast_dtype(device_type)
                             : input.scalar_type();
  // Autocast's casts stay out of the products' operands: the FP8 casts read
  // the FP32 weight itself.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return Float8LinearFunction::apply(
      input, weight,
      bias.defined() ? bias : torch::empty({0}, weight.options()), &state,
      out_dtype);
#else
  return {};
#endif
}

Float8Conversion convert_to_float8(torch::nn::Module& model,
                                   const Float8Recipe& recipe,
                                   const Float8Predicate& predicate) {
  const char* who = "lamp::nn::convert_to_float8";
  check_recipe(recipe, who);
  const auto modules = modules_of(model);
  for (const auto& item : modules) {
    TORCH_CHECK(dynamic_cast<Float8StateImpl*>(item.second) == nullptr, who,
                ": the model is converted already (layer '",
                item.first.substr(0, item.first.rfind('.')),
                "' has an FP8 state); convert it once.");
  }
  const auto holders = holders_of(modules);
  Float8Conversion result;
  bool checked_device = false;
  for (const auto& item : modules) {
    auto* linear = dynamic_cast<torch::nn::LinearImpl*>(item.second);
    if (linear == nullptr) {
      continue;
    }
    const auto& name = item.first;
    if (predicate && !predicate(name, *linear)) {
      result.skipped.emplace_back(name, "left out by the predicate");
      continue;
    }
    const auto& weight = linear->weight;
    const auto why = ineligible_reason(*linear, holders);
    if (!why.empty()) {
      result.skipped.emplace_back(name, why);
      continue;
    }
    if (!checked_device) {
      const auto reason = float8_unavailable_reason(weight.device());
      TORCH_CHECK(reason.empty(), who, ": FP8 cannot run: ", reason, ".");
      checked_device = true;
    }
    auto state = Float8State(recipe, name);
    state->to(weight.device());
    linear->register_module(kStateName, state);
    result.converted.push_back(name);
  }
  return result;
}

void update_float8_scales(
    torch::nn::Module& model,
    const std::function<void(torch::Tensor&)>& all_reduce_max) {
  std::vector<Float8StateImpl*> delayed;
  for (auto* state : states_of(model)) {
    if (state->recipe().scaling() == Float8Scaling::kDelayed) {
      delayed.push_back(state);
    }
  }
  if (delayed.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  if (all_reduce_max) {
    std::vector<torch::Tensor> pending;
    pending.reserve(delayed.size());
    for (auto* state : delayed) {
      pending.push_back(state->pending_amax);
    }
    auto all = torch::cat(pending);
    all_reduce_max(all);
    for (size_t i = 0; i < delayed.size(); ++i) {
      delayed[i]->pending_amax.copy_(
          all.narrow(0, static_cast<int64_t>(i) * kOperands, kOperands));
    }
  }
  for (auto* state : delayed) {
    const auto& recipe = state->recipe();
    auto& history = state->amax_history;
    // Newest in column 0; the oldest falls off the end.
    history.copy_(torch::roll(history, /*shifts=*/1, /*dims=*/1));
    history.select(1, 0).copy_(state->pending_amax);
    const auto amax = recipe.amax_compute() == Float8AmaxCompute::kMax
                          ? std::get<0>(history.max(/*dim=*/1))
                          : history.select(1, 0);
    // max / amax / 2^margin per operand, with host scalars only (no copy
    // to the device: the update may be captured in a CUDA graph).
    const double headroom = std::ldexp(1.0, static_cast<int>(recipe.margin()));
    auto fresh = amax.reciprocal();
    fresh.narrow(0, 0, 2).mul_(448.0 / headroom);   // input, weight: E4M3
    fresh.narrow(0, 2, 1).mul_(57344.0 / headroom); // grad_output: E5M2
    // An amax of 0 (a tensor not seen yet, or all zeros) keeps the scale;
    // non-finite amaxes never enter the history (cast_operand).
    state->scale.copy_(torch::where(amax > 0, fresh, state->scale));
    state->pending_amax.zero_();
  }
}

std::vector<Float8LayerStats> float8_stats(const torch::nn::Module& model) {
  std::vector<Float8LayerStats> stats;
  for (auto* state : states_of(model)) {
    const auto counters = state->counters.to(torch::kCPU, torch::kDouble);
    const auto c = counters.accessor<double, 2>();
    Float8LayerStats s;
    s.name = state->name();
    for (int64_t i = 0; i < kOperands; ++i) {
      s.saturated_casts.push_back(static_cast<int64_t>(c[kSaturated][i]));
      s.non_finite_casts.push_back(static_cast<int64_t>(c[kNonFinite][i]));
      s.casts.push_back(static_cast<int64_t>(c[kCasts][i]));
      s.scales.push_back(state->recipe().scaling() == Float8Scaling::kDelayed
                             ? state->scale[i].item<double>()
                             : c[kLastScale][i]);
    }
    stats.push_back(std::move(s));
  }
  return stats;
}

void save_float8_state(const torch::nn::Module& model,
                       torch::serialize::OutputArchive& archive) {
  for (auto* state : states_of(model)) {
    const auto prefix = std::string("float8/") + state->name() + "/";
    const auto& r = state->recipe();
    archive.write(
        prefix + "recipe",
        torch::tensor({static_cast<int64_t>(r.scaling()), r.amax_history_len(),
                       static_cast<int64_t>(r.amax_compute()), r.margin()}));
    archive.write(prefix + "scale", state->scale.cpu());
    archive.write(prefix + "amax_history", state->amax_history.cpu());
    archive.write(prefix + "pending_amax", state->pending_amax.cpu());
    archive.write(prefix + "counters", state->counters.cpu());
  }
}

namespace {

// What save_float8_state() wrote for each converted layer of `model`, read
// and checked; nothing loaded.
std::vector<std::pair<Float8StateImpl*, std::vector<torch::Tensor>>>
read_float8_state(const torch::nn::Module& model,
                  torch::serialize::InputArchive& archive, const char* who) {
  std::vector<std::pair<Float8StateImpl*, std::vector<torch::Tensor>>> read;
  for (auto* state : states_of(model)) {
    const auto prefix = std::string("float8/") + state->name() + "/";
    torch::Tensor recipe;
    TORCH_CHECK(archive.try_read(prefix + "recipe", recipe), who,
                ": the archive has no FP8 state for layer '", state->name(),
                "'; it was saved from a model converted otherwise (or not at "
                "all). Convert the model as it was when saved.");
    const auto& r = state->recipe();
    const auto want =
        torch::tensor({static_cast<int64_t>(r.scaling()), r.amax_history_len(),
                       static_cast<int64_t>(r.amax_compute()), r.margin()});
    const bool same = recipe.sizes() == want.sizes() &&
                      recipe.scalar_type() == want.scalar_type() &&
                      torch::equal(recipe, want);
    if (!same) {
      const auto field = [&](int64_t i) {
        return recipe.dim() == 1 && recipe.numel() == 4 &&
                       recipe.scalar_type() == torch::kLong
                   ? std::to_string(recipe[i].item<int64_t>())
                   : std::string("?");
      };
      TORCH_CHECK(false, who, ": layer '", state->name(),
                  "' was saved with recipe (scaling ", field(0), ", history ",
                  field(1), ", amax_compute ", field(2), ", margin ", field(3),
                  ") but is converted with (scaling ", want[0].item<int64_t>(),
                  " = ", scaling_name(r.scaling()), ", history ",
                  r.amax_history_len(), ", amax_compute ",
                  want[2].item<int64_t>(), ", margin ", r.margin(),
                  "); convert it with the recipe it was saved with.");
    }
    std::vector<torch::Tensor> tensors;
    for (const auto* part : {&state->scale, &state->amax_history,
                             &state->pending_amax, &state->counters}) {
      const char* key = part == &state->scale          ? "scale"
                        : part == &state->amax_history ? "amax_history"
                        : part == &state->pending_amax ? "pending_amax"
                                                       : "counters";
      torch::Tensor t;
      TORCH_CHECK(archive.try_read(prefix + key, t), who, ": layer '",
                  state->name(), "' lacks its ", key,
                  " in the archive (damaged?).");
      TORCH_CHECK(
          t.sizes() == part->sizes() && t.scalar_type() == part->scalar_type(),
          who, ": layer '", state->name(), "': ", key, " is ", t.sizes(), " ",
          t.scalar_type(), ", expected ", part->sizes(), " ",
          part->scalar_type(), " (damaged archive?).");
      tensors.push_back(t);
    }
    read.emplace_back(state, std::move(tensors));
  }
  return read;
}

} // namespace

void check_float8_state(const torch::nn::Module& model,
                        torch::serialize::InputArchive& archive) {
  read_float8_state(model, archive, "lamp::nn::check_float8_state");
}

void load_float8_state(torch::nn::Module& model,
                       torch::serialize::InputArchive& archive) {
  // Every layer read and checked before the first is loaded.
  const auto read =
      read_float8_state(model, archive, "lamp::nn::load_float8_state");
  torch::NoGradGuard no_grad;
  for (const auto& item : read) {
    auto* state = item.first;
    state->scale.copy_(item.second[0]);
    state->amax_history.copy_(item.second[1]);
    state->pending_amax.copy_(item.second[2]);
    state->counters.copy_(item.second[3]);
  }
}

} // namespace nn
} // namespace lamp
