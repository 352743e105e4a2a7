#include "lamp/models/gpt.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "lamp/nn/attention.h"
#include "lamp/nn/linear.h"
#include "lamp/nn/rms_norm.h"

namespace lamp {
namespace models {
namespace {

namespace F = torch::nn::functional;

void check_options(const GPTOptions& o) {
  const char* who = "lamp::models::GPT";
  TORCH_CHECK(o.layers() >= 1 && o.heads() >= 1 && o.width() >= 1 &&
                  o.context() >= 1 && o.vocab_size() >= 1,
              who,
              ": layers, heads, width, context and vocab_size must be at "
              "least 1, got ",
              o.layers(), ", ", o.heads(), ", ", o.width(), ", ", o.context(),
              ", ", o.vocab_size(), ".");
  TORCH_CHECK(o.width() % o.heads() == 0, who, ": ", o.heads(),
              " heads do not divide the width ", o.width(),
              "; give a width that is a multiple of the heads.");
  TORCH_CHECK(o.dropout() >= 0 && o.dropout() < 1, who,
              ": dropout must be in [0, 1), got ", o.dropout(), ".");
}

constexpr double kNormEps = 1e-5;

// LayerNorm without its bias (nanoGPT's bias=False): LibTorch's LayerNorm,
// whose forward takes an undefined bias, with `bias` left undefined, so
// that what knows LayerNorm (network_to_half's FP32 norms, the decay
// groups, the precision report) knows this one too. An undefined
// parameter is not a parameter: named_parameters() and state dicts leave it
// out.
class BiasFreeLayerNormImpl : public torch::nn::LayerNormImpl {
 public:
  explicit BiasFreeLayerNormImpl(int64_t width)
      : torch::nn::LayerNormImpl(torch::nn::LayerNormOptions({width})
                                     .eps(kNormEps)
                                     .elementwise_affine(true)) {
    drop_bias();
  }
  void reset() override {
    torch::nn::LayerNormImpl::reset();
    drop_bias();
  }

 private:
  void drop_bias() {
    bias = torch::Tensor();
    parameters_["bias"] = torch::Tensor();
  }
};

// The norm of `options` over `width` channels.
torch::nn::AnyModule make_norm(const GPTOptions& options, int64_t width) {
  if (options.norm() == GPTNorm::kRMSNorm) {
    return torch::nn::AnyModule(
        lamp::nn::RMSNorm(lamp::nn::RMSNormOptions({width}).eps(kNormEps)));
  }
  if (!options.bias()) {
    const std::shared_ptr<torch::nn::LayerNormImpl> norm =
        std::make_shared<BiasFreeLayerNormImpl>(width);
    return torch::nn::AnyModule(torch::nn::LayerNorm(norm));
  }
  return torch::nn::AnyModule(torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({width}).eps(kNormEps).elementwise_affine(
          true)));
}

torch::nn::Linear make_linear(const GPTOptions& options, int64_t in,
                              int64_t out) {
  return torch::nn::Linear(
      torch::nn::LinearOptions(in, out).bias(options.bias()));
}

} // namespace

std::string GPTOptions::name() const {
  std::ostringstream s;
  s << "gpt(layers=" << layers() << ", heads=" << heads()
    << ", width=" << width() << ", context=" << context()
    << ", vocab=" << vocab_size();
  // Only where not the defaults: the names lamp 0.5 gave before these
  // options existed stay the names of the same models.
  if (!bias()) {
    s << ", bias=false";
  }
  if (norm() == GPTNorm::kRMSNorm) {
    s << ", norm=rmsnorm";
  }
  if (gelu() == GPTGelu::kTanh) {
    s << ", gelu=tanh";
  }
  s << ")";
  return s.str();
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTOptions& options)
    : heads_(options.heads()), dropout_(options.dropout()) {
  const int64_t c = options.width();
  c_attn = register_module("c_attn", make_linear(options, c, 3 * c));
  c_proj = register_module("c_proj", make_linear(options, c, c));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const auto qkv = lamp::nn::linear(x, c_attn).split(c, /*dim=*/2);
  const auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, heads_, c / heads_}).transpose(1, 2);
  };
  auto y = lamp::nn::scaled_dot_product_attention(
      heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), /*attn_mask=*/{},
      is_training() ? dropout_ : 0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).reshape({b, t, c});
  return F::dropout(
      lamp::nn::linear(y, c_proj),
      F::DropoutFuncOptions().p(dropout_).training(is_training()));
}

GPTBlockImpl::GPTBlockImpl(const GPTOptions& options)
    : dropout_(options.dropout()), gelu_(options.gelu()) {
  const int64_t c = options.width();
  ln_1 = make_norm(options, c);
  register_module("ln_1", ln_1.ptr());
  attn = register_module("attn", CausalSelfAttention(options));
  ln_2 = make_norm(options, c);
  register_module("ln_2", ln_2.ptr());
  // "mlp.c_fc", "mlp.c_proj": nanoGPT's names, in a plain child module.
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  c_fc = mlp->register_module("c_fc", make_linear(options, c, 4 * c));
  c_proj = mlp->register_module("c_proj", make_linear(options, 4 * c, c));
}

torch::Tensor GPTBlockImpl::forward(torch::Tensor x) {
  x = x + attn->forward(ln_1.forward(x));
  // lamp::nn::linear, not Linear::forward: one autocast op with its bias
  // (include/lamp/nn/linear.h).
  const auto hidden = lamp::nn::linear(ln_2.forward(x), c_fc);
  auto m = lamp::nn::linear(
      gelu_ == GPTGelu::kTanh
          ? F::gelu(hidden, F::GELUFuncOptions().approximate("tanh"))
          : F::gelu(hidden),
      c_proj);
  return x + F::dropout(m, F::DropoutFuncOptions().p(dropout_).training(
                               is_training()));
}

GPTImpl::GPTImpl(GPTOptions options) : options_(std::move(options)) {
  check_options(options_);
  const int64_t c = options_.width();
  wte = register_module("wte", torch::nn::Embedding(options_.vocab_size(), c));
  wpe = register_module("wpe", torch::nn::Embedding(options_.context(), c));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < options_.layers(); ++i) {
    h->push_back(GPTBlock(options_));
  }
  ln_f = make_norm(options_, c);
  register_module("ln_f", ln_f.ptr());
  torch::NoGradGuard no_grad;
  const double residual_std =
      0.02 / std::sqrt(2.0 * static_cast<double>(options_.layers()));
  for (const auto& item : named_parameters()) {
    const auto& name = item.key();
    auto p = item.value();
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (is_norm) {
      continue; // the norms: weight 1 (and bias 0) as built
    }
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else if (name.find("c_proj.weight") != std::string::npos) {
      p.normal_(0.0, residual_std);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  const char* who = "lamp::models::GPT::forward";
  TORCH_CHECK(
      !tokens.is_floating_point() && !tokens.is_complex(), who,
      ": token ids must be integers, got ", tokens.scalar_type(),
      " (a DeviceLoader serves them with LoaderOptions::dtype(kLong)).");
  auto ids = tokens;
  TORCH_CHECK(ids.dim() == 2, who, ": token ids [B, T] expected, got ",
              tokens.sizes(),
              tokens.dim() == 4 ? " (lamp 0.4's [B, 1, 1, T] windows: lamp "
                                  "0.5 stores token windows as [N, T], "
                                  "data::text_windows())"
                                : "",
              ".");
  const int64_t t = ids.size(1);
  TORCH_CHECK(t >= 1 && t <= options_.context(), who, ": ", t,
              " tokens do not fit the context of ", options_.context(), ".");
  ids = ids.to(torch::kLong);
  const auto positions = torch::arange(
      t, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
  auto x = wte->forward(ids) + wpe->forward(positions);
  x = F::dropout(
      x, F::DropoutFuncOptions().p(options_.dropout()).training(is_training()));
  for (const auto& block : *h) {
    x = block->as<GPTBlock>()->forward(x);
  }
  x = ln_f.forward(x);
  // The output projection is the token embedding (tied weights).
  return F::linear(x, wte->weight.to(x.scalar_type()));
}

NamedModel make_gpt(const GPTOptions& options) {
  GPT gpt(options);
  return {gpt.ptr(),
          [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); }};
}

int64_t gpt_parameter_count(const GPTOptions& o) {
  const int64_t c = o.width();
  const double c_d = static_cast<double>(c);
  const double estimate =
      static_cast<double>(o.layers()) * (12.0 * c_d * c_d + 13.0 * c_d) +
      static_cast<double>(o.vocab_size() + o.context() + 2) * c_d;
  TORCH_CHECK(o.layers() >= 0 && c >= 0 && o.vocab_size() >= 0 &&
                  o.context() >= 0 && estimate < 9.2e18,
              "lamp::models::gpt_parameter_count: ", o.name(), " has about ",
              estimate,
              " parameters, more than an int64_t counts; use a smaller width "
              "or fewer layers.");
  // A norm: its weight, and its bias for a LayerNorm with biases.
  const int64_t norm = o.norm() == GPTNorm::kLayerNorm && o.bias() ? 2 * c : c;
  // Per block: ln_1 and ln_2; c_attn 3c^2 (+ 3c), its c_proj c^2 (+ c), the
  // MLP's c_fc 4c^2 (+ 4c) and c_proj 4c^2 (+ c).
  const int64_t per_block = 12 * c * c + (o.bias() ? 9 * c : 0) + 2 * norm;
  return o.layers() * per_block + (o.vocab_size() + o.context()) * c + norm;
}

double gpt_training_flops(const GPTOptions& o) {
  const double c = static_cast<double>(o.width());
  const double layers = static_cast<double>(o.layers());
  // The parameters but wpe, as nanoGPT counts them.
  const double n = static_cast<double>(gpt_parameter_count(o)) -
                   static_cast<double>(o.context()) * c;
  const double t = static_cast<double>(o.context());
  return t * (6.0 * n + 12.0 * layers * t * c);
}

torch::Tensor generate(
    torch::nn::Module& module,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const torch::Tensor& prompt, int64_t context,
    const GenerateOptions& options) {
  const char* who = "lamp::models::generate";
  TORCH_CHECK(
      prompt.dim() == 1 && prompt.size(0) >= 1 && !prompt.is_floating_point(),
      who, ": the prompt must be integer token ids [T0], T0 >= 1, got ",
      prompt.scalar_type(), " ", prompt.sizes(), ".");
  TORCH_CHECK(context >= 1, who, ": context must be >= 1, got ", context, ".");
  TORCH_CHECK(options.tokens() >= 0, who, ": tokens must be >= 0, got ",
              options.tokens(), ".");
  TORCH_CHECK(std::isfinite(options.temperature()) && options.temperature() > 0,
              who, ": temperature must be finite and positive, got ",
              options.temperature(), ".");
  TORCH_CHECK(options.top_k() >= 0, who, ": top_k must be >= 0, got ",
              options.top_k(), ".");
  const bool was_training = module.is_training();
  module.eval();
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(options.seed());
  torch::Device device = torch::kCPU;
  for (const auto& p : module.parameters()) {
    device = p.device();
    break;
  }
  auto tokens = prompt.to(torch::kLong).cpu();
  try {
    for (int64_t i = 0; i < options.tokens(); ++i) {
      if (options.stop_requested() && options.stop_requested()()) {
        break;
      }
      const int64_t n = tokens.size(0);
      const auto window = tokens.slice(0, std::max<int64_t>(0, n - context));
      auto logits = forward(window.unsqueeze(0).to(device))
                        .select(1, -1)
                        .squeeze(0)
                        .to(torch::kFloat)
                        .cpu()
                        .div(options.temperature());
      if (options.top_k() > 0 && options.top_k() < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(options.top_k()))
                             .select(0, options.top_k() - 1);
        logits = logits.masked_fill(logits < kth,
                                    -std::numeric_limits<float>::infinity());
      }
      const auto probs = torch::softmax(logits, 0);
      const auto next = torch::multinomial(probs, 1, false, generator);
      tokens = torch::cat({tokens, next});
    }
  } catch (...) {
    module.train(was_training);
    throw;
  }
  module.train(was_training);
  return tokens;
}

} // namespace models
} // namespace lamp
