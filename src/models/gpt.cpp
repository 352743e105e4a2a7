#include "lamp/models/gpt.h"

#include "lamp/nn/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "lamp/nn/attention.h"
#include "lamp/nn/float8.h"
#include "lamp/nn/linear.h"
#include "lamp/nn/rms_norm.h"
#include "lamp/nn/weight_cast.h"
#include "lamp/ops/add_norm.h"
#include "lamp/ops/gelu_mlp.h"
#include "lamp/ops/linear_bgrad.h"
#include "lamp/ops/linear_cross_entropy.h"
#include "platform/autocast_on.h"
#include "platform/compat.h"

namespace lamp {
namespace models {
namespace {

namespace F = torch::nn::functional;

// What a block reads of `o` (its heads, width and dropout), for `who`.
void check_block_options(const GPTOptions& o, const char* who) {
  TORCH_CHECK(o.heads() >= 1 && o.width() >= 1, who,
              ": heads and width must be at least 1, got ", o.heads(), " and ",
              o.width(), ".");
  TORCH_CHECK(o.width() % o.heads() == 0, who, ": ", o.heads(),
              " heads do not divide the width ", o.width(),
              "; give a width that is a multiple of the heads.");
  TORCH_CHECK(o.dropout() >= 0 && o.dropout() < 1, who,
              ": dropout must be in [0, 1), got ", o.dropout(), ".");
}

void check_options(const GPTOptions& o) {
  const char* who = "lamp::models::GPT";
  TORCH_CHECK(o.layers() >= 1 && o.heads() >= 1 && o.width() >= 1 &&
                  o.context() >= 1 && o.vocab_size() >= 1,
              who,
              ": layers, heads, width, context and vocab_size must be at "
              "least 1, got ",
              o.layers(), ", ", o.heads(), ", ", o.width(), ", ", o.context(),
              ", ", o.vocab_size(), ".");
  check_block_options(o, who);
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
  // LayerNormImpl's clone() would rebuild a LayerNorm, with a bias.
  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<torch::Device>& device =
          c10::nullopt) const override {
    auto copy = std::make_shared<BiasFreeLayerNormImpl>(*this);
    copy->parameters_.clear();
    copy->reset(); // its own weight, not this one's
    torch::NoGradGuard no_grad;
    copy->weight.set_data(device && weight.device() != *device
                              ? weight.to(*device)
                              : weight.clone());
    copy->weight.requires_grad_(weight.requires_grad());
    return copy;
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

// x + branch and the norm `norm` of it, in one operation (lamp::ops). The
// norm's output feeds a linear: under autocast it comes in autocast's dtype,
// the bits that linear would cast it to.
ops::AddNormResult add_then_norm(const torch::nn::AnyModule& norm,
                                 const torch::Tensor& x,
                                 const torch::Tensor& branch) {
  ops::AddNormOptions o;
  const auto device_type = x.device().type();
  if (lamp::detail::autocast_on(device_type)) {
    o.output_dtype(lamp::detail::autocast_dtype(device_type));
  }
  if (const auto ln =
          std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(norm.ptr())) {
    return ops::add_layer_norm(x, branch, ln->weight, ln->bias,
                               o.eps(ln->options.eps()));
  }
  const auto rms = std::dynamic_pointer_cast<lamp::nn::RMSNormImpl>(norm.ptr());
  TORCH_INTERNAL_ASSERT(rms != nullptr, "a GPT norm is a LayerNorm or RMSNorm");
  return ops::add_rms_norm(x, branch, rms->weight,
                           o.eps(rms->options.eps().value_or(kNormEps)));
}

torch::nn::Linear make_linear(const GPTOptions& options, int64_t in,
                              int64_t out) {
  return torch::nn::Linear(
      torch::nn::LinearOptions(in, out).bias(options.bias()));
}

// `layer` applied to x as lamp::nn::linear does, or with
// GPTOptions::fused_bias_grad through lamp::ops::linear_bgrad (on the
// parameters as a CastWeightsOnce cast them) where the layer has a bias
// and does not compute in FP8.
torch::Tensor block_linear(const torch::Tensor& x,
                           const torch::nn::Linear& layer,
                           bool fused_bias_grad) {
  if (fused_bias_grad && layer->bias.defined() &&
      lamp::nn::float8_state(*layer) == nullptr) {
    return ops::linear_bgrad(x, lamp::nn::cast_weight(layer->weight),
                             lamp::nn::cast_weight(layer->bias));
  }
  return lamp::nn::linear(x, layer);
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

GPTKVCache::GPTKVCache(const GPTImpl& gpt, int64_t batch)
    : batch_(batch),
      capacity_(gpt.options().context()),
      keys_(static_cast<size_t>(gpt.options().layers())),
      values_(static_cast<size_t>(gpt.options().layers())) {
  TORCH_CHECK(batch >= 1, "lamp::models::GPTKVCache: batch must be >= 1, got ",
              batch, ".");
}

std::pair<torch::Tensor, torch::Tensor> GPTKVCache::store(
    int64_t layer, const torch::Tensor& key, const torch::Tensor& value) {
  const char* who = "lamp::models::GPTKVCache";
  TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(keys_.size()), who,
              ": block ", layer, " of a cache for ", keys_.size(),
              " blocks; build the cache from the model it serves.");
  const int64_t t = key.size(2);
  TORCH_CHECK(key.size(0) == batch_, who, ": ", key.size(0),
              " sequences given to a cache of ", batch_, ".");
  TORCH_CHECK(length_ + t <= capacity_, who, ": ", length_,
              " cached tokens and ", t, " more exceed the context of ",
              capacity_,
              "; clear() the cache and give the last context tokens again.");
  auto& keys = keys_[static_cast<size_t>(layer)];
  auto& values = values_[static_cast<size_t>(layer)];
  if (!keys.defined() || keys.scalar_type() != key.scalar_type() ||
      keys.device() != key.device() || keys.size(1) != key.size(1) ||
      keys.size(3) != key.size(3)) {
    TORCH_CHECK(length_ == 0, who, ": the keys changed dtype or device (",
                key.scalar_type(), " on ", key.device(),
                ") with tokens cached; clear() the cache first.");
    const std::vector<int64_t> shape = {batch_, key.size(1), capacity_,
                                        key.size(3)};
    keys = torch::empty(shape, key.options());
    values = torch::empty(shape, value.options());
  }
  keys.narrow(2, length_, t).copy_(key);
  values.narrow(2, length_, t).copy_(value);
  return {keys.narrow(2, 0, length_ + t), values.narrow(2, 0, length_ + t)};
}

void GPTKVCache::advance(int64_t tokens) {
  length_ += tokens;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTOptions& options)
    : heads_(options.heads()),
      dropout_(options.dropout()),
      fused_bias_grad_(options.fused_bias_grad()) {
  check_block_options(options, "lamp::models::CausalSelfAttention");
  const int64_t c = options.width();
  c_attn = register_module("c_attn", make_linear(options, c, 3 * c));
  c_proj = register_module("c_proj", make_linear(options, c, c));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const auto qkv =
      block_linear(x, c_attn, fused_bias_grad_).split(c, /*dim=*/2);
  const auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, heads_, c / heads_}).transpose(1, 2);
  };
  auto y = lamp::nn::scaled_dot_product_attention(
      heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), /*attn_mask=*/{},
      is_training() ? dropout_ : 0.0, /*is_causal=*/true);
  return output(y);
}

torch::Tensor CausalSelfAttentionImpl::output(const torch::Tensor& y) const {
  const auto joined = y.transpose(1, 2).flatten(2);
  const auto projected = block_linear(joined, c_proj, fused_bias_grad_);
  return F::dropout(
      projected, F::DropoutFuncOptions().p(dropout_).training(is_training()));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x,
                                               GPTKVCache& cache,
                                               int64_t layer) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int64_t past = cache.length();
  const auto qkv =
      block_linear(x, c_attn, fused_bias_grad_).split(c, /*dim=*/2);
  const auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, heads_, c / heads_}).transpose(1, 2);
  };
  const auto kv = cache.store(layer, heads(qkv[1]), heads(qkv[2]));
  const auto q = heads(qkv[0]);
  const double p = is_training() ? dropout_ : 0.0;
  torch::Tensor y;
  if (past == 0) {
    // The first tokens: the causal mask of a whole sequence.
    y = lamp::nn::scaled_dot_product_attention(q, kv.first, kv.second, {}, p,
                                               /*is_causal=*/true);
  } else if (t == 1) {
    // One new token sees every cached one and itself.
    y = lamp::nn::scaled_dot_product_attention(q, kv.first, kv.second, {}, p);
  } else {
    // New token i (position past + i) sees keys 0 .. past + i.
    const auto options =
        torch::TensorOptions().dtype(torch::kLong).device(x.device());
    const auto mask = torch::arange(past + t, options).unsqueeze(0) <=
                      (torch::arange(t, options) + past).unsqueeze(1);
    y = lamp::nn::scaled_dot_product_attention(q, kv.first, kv.second, mask, p);
  }
  return output(y);
}

GPTBlockImpl::GPTBlockImpl(const GPTOptions& options)
    : dropout_(options.dropout()),
      gelu_(options.gelu()),
      fused_add_norm_(options.fused_add_norm()),
      fused_mlp_(options.fused_mlp()),
      fused_bias_grad_(options.fused_bias_grad()) {
  check_block_options(options, "lamp::models::GPTBlock");
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

torch::Tensor GPTBlockImpl::forward(torch::Tensor x, GPTKVCache* cache,
                                    int64_t layer) {
  const auto normed = ln_1.forward(x);
  if (fused_add_norm_) {
    const auto halves = forward_fused(x, normed, cache, layer);
    return halves.first + halves.second;
  }
  x = x + (cache != nullptr ? attn->forward(normed, *cache, layer)
                            : attn->forward(normed));
  return x + mlp(ln_2.forward(x));
}

std::pair<torch::Tensor, torch::Tensor> GPTBlockImpl::forward_fused(
    const torch::Tensor& x, const torch::Tensor& normed, GPTKVCache* cache,
    int64_t layer) {
  const auto a = cache != nullptr ? attn->forward(normed, *cache, layer)
                                  : attn->forward(normed);
  auto r = add_then_norm(ln_2, x, a);
  return {r.sum, mlp(r.normed)};
}

torch::Tensor GPTBlockImpl::mlp(const torch::Tensor& normed) {
  const char* approximate = gelu_ == GPTGelu::kTanh ? "tanh" : "none";
  torch::Tensor m;
  if (fused_mlp_ && lamp::nn::float8_state(*c_fc) == nullptr &&
      lamp::nn::float8_state(*c_proj) == nullptr) {
    using lamp::nn::cast_weight;
    m = ops::gelu_mlp(normed, cast_weight(c_fc->weight),
                      cast_weight(c_fc->bias), cast_weight(c_proj->weight),
                      cast_weight(c_proj->bias),
                      ops::GeluMlpOptions()
                          .approximate(approximate)
                          .fused_bias_grad(fused_bias_grad_));
  } else {
    // lamp::nn::linear, not Linear::forward: one autocast op with its bias
    // (include/lamp/nn/linear.h).
    const auto hidden = block_linear(normed, c_fc, fused_bias_grad_);
    m = block_linear(
        F::gelu(hidden, F::GELUFuncOptions().approximate(approximate)), c_proj,
        fused_bias_grad_);
  }
  return F::dropout(
      m, F::DropoutFuncOptions().p(dropout_).training(is_training()));
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
  const auto x = features(tokens);
  // The output projection is the token embedding (tied weights).
  return F::linear(x, wte->weight.to(x.scalar_type()));
}

torch::Tensor GPTImpl::loss(const torch::Tensor& tokens,
                            const torch::Tensor& targets) {
  TORCH_CHECK(targets.defined() && targets.sizes() == tokens.sizes(),
              "lamp::models::GPT::loss: the targets (the next token of each "
              "position) must have the tokens' shape ",
              tokens.sizes(), ", got ",
              targets.defined() ? targets.sizes() : c10::IntArrayRef{}, ".");
  const auto x = features(tokens);
  return options_.fused_head_loss()
             ? ops::linear_cross_entropy(x, wte->weight, targets)
             : ops::linear_cross_entropy_reference(x, wte->weight, targets);
}

torch::Tensor GPTImpl::features(const torch::Tensor& tokens) {
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
  const int64_t past = cache_ != nullptr ? cache_->length() : 0;
  TORCH_CHECK(past + t <= options_.context(), who, ": ", t,
              " tokens after the ", past,
              " of the KV cache do not fit the context of ", options_.context(),
              "; clear() the cache and give the last context tokens again.");
  TORCH_CHECK(ids.device() == wte->weight.device(), who,
              ": the token ids are "
              "on ",
              ids.device(), ", the model on ", wte->weight.device(),
              "; move the ids to the model's device (ids.to(device)).");
  // What the embedding would refuse with an index error: checked on the
  // CPU, in one pass over the ids; a GPU's are not (that would wait for the
  // device every step).
  if (ids.device().is_cpu() && ids.numel() > 0) {
    const auto range = torch::aminmax(ids);
    const auto low = std::get<0>(range).item<int64_t>();
    const auto high = std::get<1>(range).item<int64_t>();
    TORCH_CHECK(low >= 0 && high < options_.vocab_size(), who, ": token ids ",
                "must be in [0, ", options_.vocab_size(), "), got ",
                low < 0 ? low : high,
                "; the ids come from another "
                "tokenizer or vocabulary than the model's (vocab_size ",
                options_.vocab_size(), ").");
  }
  TORCH_CHECK(cache_ == nullptr || !torch::GradMode::is_enabled(), who,
              ": the KV cache serves generation, without gradients (its "
              "buffers are written in place each call); run it under "
              "torch::NoGradGuard, or without the cache to train.");
  ids = ids.to(torch::kLong);
  const auto positions = torch::arange(
      past, past + t,
      torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
  auto x = wte->forward(ids) + wpe->forward(positions);
  x = F::dropout(
      x, F::DropoutFuncOptions().p(options_.dropout()).training(is_training()));
  const bool recompute = options_.activation_checkpointing() && is_training() &&
                         cache_ == nullptr && torch::GradMode::is_enabled();
  // The blocks' weights cast for all of them at once (nothing is cast where
  // autocast is off). A recomputed block would cast its own again. Only
  // where gradients flow: without them (evaluation, generation) autocast's
  // cache keeps its casts across the forwards of one autocast region, where
  // the guard would cast every weight again for each token.
  std::optional<lamp::nn::CastWeightsOnce> casts;
  if (options_.fused_weight_cast() && !recompute &&
      torch::GradMode::is_enabled()) {
    casts.emplace(*this);
  }
  torch::Tensor out;
  if (options_.fused_add_norm() && !recompute) {
    out = fused_blocks(x);
  } else {
    int64_t layer = 0;
    for (const auto& block : h->children()) {
      const auto b = std::dynamic_pointer_cast<GPTBlockImpl>(block);
      if (recompute) {
        x = lamp::nn::activation_checkpoint(
            [b](const torch::Tensor& in) { return b->forward(in); }, x,
            b->parameters(), /*preserve_rng=*/options_.dropout() > 0);
      } else {
        x = b->forward(x, cache_, layer);
      }
      ++layer;
    }
    out = ln_f.forward(x);
  }
  if (cache_ != nullptr) {
    cache_->advance(t);
  }
  return out;
}

torch::Tensor GPTImpl::fused_blocks(torch::Tensor x) {
  // Each block's last add goes with the next block's ln_1 (or ln_f): x is
  // normalised by the operation that made it.
  std::vector<std::shared_ptr<GPTBlockImpl>> blocks;
  for (const auto& block : h->children()) {
    blocks.push_back(std::dynamic_pointer_cast<GPTBlockImpl>(block));
  }
  torch::Tensor normed =
      blocks.empty() ? ln_f.forward(x) : blocks.front()->ln_1.forward(x);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto halves =
        blocks[i]->forward_fused(x, normed, cache_, static_cast<int64_t>(i));
    const auto& next = i + 1 < blocks.size() ? blocks[i + 1]->ln_1 : ln_f;
    auto r = add_then_norm(next, halves.first, halves.second);
    x = r.sum;
    normed = r.normed;
  }
  return normed;
}

NamedModel make_gpt(const GPTOptions& options) {
  GPT gpt(options);
  NamedModel model{gpt.ptr(), [gpt](const torch::Tensor& x) mutable {
                     return gpt->forward(x);
                   }};
  if (options.fused_head_loss()) {
    model.loss = [gpt](const torch::Tensor& x,
                       const torch::Tensor& targets) mutable {
      return gpt->loss(x, targets);
    };
  }
  return model;
}

int64_t gpt_parameter_count(const GPTOptions& o) {
  const char* who = "lamp::models::gpt_parameter_count";
  const int64_t c = o.width();
  TORCH_CHECK(
      o.layers() >= 0 && c >= 0 && o.vocab_size() >= 0 && o.context() >= 0, who,
      ": ", o.name(),
      " has a negative count; layers, width, vocab_size and context "
      "must be >= 0.");
  // Every term in double, where no sum overflows: a bound of each int64_t
  // product and sum below.
  const double c_d = static_cast<double>(c);
  const double estimate =
      static_cast<double>(o.layers()) * (12.0 * c_d * c_d + 13.0 * c_d) +
      (static_cast<double>(o.vocab_size()) + static_cast<double>(o.context()) +
       2.0) *
          c_d;
  TORCH_CHECK(estimate < 9.2e18, who, ": ", o.name(), " has about ", estimate,
              " parameters, more than an int64_t counts; use a smaller width, "
              "fewer layers, or a smaller vocab_size or context.");
  // A norm: its weight, and its bias for a LayerNorm with biases.
  const int64_t norm = o.norm() == GPTNorm::kLayerNorm && o.bias() ? 2 * c : c;
  // Per block: ln_1 and ln_2; c_attn 3c^2 (+ 3c), its c_proj c^2 (+ c), the
  // MLP's c_fc 4c^2 (+ 4c) and c_proj 4c^2 (+ c). Not computed without
  // blocks, where a width too wide for one is no error.
  const int64_t blocks =
      o.layers() == 0
          ? 0
          : o.layers() * (12 * c * c + (o.bias() ? 9 * c : 0) + 2 * norm);
  return blocks + (o.vocab_size() + o.context()) * c + norm;
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

namespace {

// The GPT that `module` is or holds (network_to_half's wrappers around one),
// or nullptr.
GPTImpl* find_gpt(torch::nn::Module& module) {
  if (auto* gpt = dynamic_cast<GPTImpl*>(&module)) {
    return gpt;
  }
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto* gpt = dynamic_cast<GPTImpl*>(child.get())) {
      return gpt;
    }
  }
  return nullptr;
}

// Puts a GPT's previous cache back when generation ends, however it ends.
class CacheScope {
 public:
  CacheScope(GPTImpl* gpt, GPTKVCache* cache)
      : gpt_(gpt), previous_(gpt != nullptr ? gpt->kv_cache() : nullptr) {
    if (gpt_ != nullptr) {
      gpt_->set_kv_cache(cache);
    }
  }
  ~CacheScope() {
    if (gpt_ != nullptr) {
      gpt_->set_kv_cache(previous_);
    }
  }
  CacheScope(const CacheScope&) = delete;
  CacheScope& operator=(const CacheScope&) = delete;

 private:
  GPTImpl* gpt_;
  GPTKVCache* previous_;
};

// The next token's distribution from the last position's logits: the ids
// below vocab_size, the temperature, then top-k, then top-p (the most
// likely tokens whose probabilities first reach top_p, the most likely
// always kept).
torch::Tensor next_token_probabilities(torch::Tensor logits,
                                       const GenerateOptions& options) {
  if (options.vocab_size() > 0) {
    TORCH_CHECK(options.vocab_size() <= logits.size(0),
                "lamp::models::generate: vocab_size ", options.vocab_size(),
                " is more than the model's ", logits.size(0),
                " logits; give at most that (0: all of them).");
    logits = logits.narrow(0, 0, options.vocab_size());
  }
  logits = logits.to(torch::kFloat).cpu();
  const float top = logits.max().item<float>();
  TORCH_CHECK(std::isfinite(top),
              "lamp::models::generate: the model's logits at the last "
              "position are not finite (their maximum is ",
              top,
              "): the weights or the forward have overflowed or hold NaN; "
              "check the model (a run whose loss went NaN) before sampling.");
  // The maximum subtracted first (softmax's own shift, the same
  // distribution): a temperature so small that logits / temperature would
  // overflow to inf (and softmax to NaN) leaves the most likely tokens at 0
  // and sends the others to -inf, sampling the most likely token. In double,
  // where such a temperature is not 0 as it would be as a float.
  logits = (logits - top)
               .to(torch::kDouble)
               .div(options.temperature())
               .to(torch::kFloat);
  if (options.top_k() > 0 && options.top_k() < logits.size(0)) {
    const auto kth = std::get<0>(logits.topk(options.top_k()))
                         .select(0, options.top_k() - 1);
    logits = logits.masked_fill(logits < kth,
                                -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, 0);
  if (options.top_p() < 1.0) {
    const auto sorted = probs.sort(/*dim=*/0, /*descending=*/true);
    const auto& values = std::get<0>(sorted);
    // Tokens after the set's sum has reached top_p are dropped.
    const auto dropped = (values.cumsum(0) - values) >= options.top_p();
    probs = torch::zeros_like(probs).scatter(0, std::get<1>(sorted),
                                             values.masked_fill(dropped, 0));
  }
  return probs;
}

} // namespace

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
  TORCH_CHECK(options.top_p() > 0 && options.top_p() <= 1, who,
              ": top_p must be in (0, 1], got ", options.top_p(), ".");
  TORCH_CHECK(options.vocab_size() >= 0, who,
              ": vocab_size must be >= 0 (0: every id), got ",
              options.vocab_size(), ".");
  const bool was_training = module.is_training();
  module.eval();
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(options.seed());
  torch::Device device = torch::kCPU;
  for (const auto& p : module.parameters()) {
    device = p.device();
    break;
  }
  // The cache serves a GPT of this context only: another `context` slides
  // its own windows.
  GPTImpl* gpt = find_gpt(module);
  std::unique_ptr<GPTKVCache> cache;
  if (options.kv_cache() && gpt != nullptr &&
      gpt->options().context() == context) {
    cache = std::make_unique<GPTKVCache>(*gpt);
  }
  auto tokens = prompt.to(torch::kLong).cpu();
  // Checked here, on the host, rather than by the embedding's lookup (a raw
  // index error, or a device-side assert on CUDA) or by the forward once
  // the text has outgrown the GPT's context (every token drawn lost).
  const int64_t lowest = tokens.min().item<int64_t>();
  const int64_t highest = tokens.max().item<int64_t>();
  TORCH_CHECK(lowest >= 0, who, ": the prompt holds the token id ", lowest,
              "; ids are >= 0.");
  if (gpt != nullptr) {
    const int64_t vocab = gpt->options().vocab_size();
    TORCH_CHECK(highest < vocab, who, ": the prompt holds the token id ",
                highest, ", outside the GPT's vocabulary of ", vocab,
                " (ids 0..", vocab - 1,
                "); encode it with the tokenizer the model was trained "
                "with.");
    TORCH_CHECK(options.vocab_size() <= vocab, who, ": vocab_size ",
                options.vocab_size(), " is more than the GPT's vocabulary of ",
                vocab, "; give at most that (0: all of it).");
    TORCH_CHECK(context <= gpt->options().context(), who, ": context ", context,
                " is longer than the GPT's context of ",
                gpt->options().context(), "; give at most that.");
  }
  try {
    // generate()'s own cache or none: a cache the caller left set holds other
    // tokens, after which every window here would be placed.
    CacheScope scope(gpt, cache.get());
    for (int64_t i = 0; i < options.tokens(); ++i) {
      if (options.stop_requested() && options.stop_requested()()) {
        break;
      }
      const int64_t n = tokens.size(0);
      // Without the cache (or once the text outgrows the context): the
      // last `context` tokens, computed whole. With it: the tokens it does
      // not hold yet, the prompt first, then one at a time.
      auto input = tokens.slice(0, std::max<int64_t>(0, n - context));
      if (cache) {
        if (n > context || cache->length() == 0) {
          cache->clear();
        } else {
          input = tokens.slice(0, cache->length());
        }
      }
      const auto logits =
          forward(input.unsqueeze(0).to(device)).select(1, -1).squeeze(0);
      const auto probs = next_token_probabilities(logits, options);
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
