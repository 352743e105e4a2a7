#pragma once

/// \file
/// A decoder-only transformer (GPT) over bytes, in nanoGPT's layout: the
/// model of train_gpt and of lamp_bench --model gpt.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>

#include "lamp/models/registry.h"

namespace lamp {
namespace models {

/// The shape of a GPT. The defaults are nanoGPT's small character-level
/// configuration (about 10.8 M parameters).
struct GPTOptions {
  /// Transformer blocks.
  TORCH_ARG(int64_t, layers) = 6;
  /// Attention heads per block; must divide `width`.
  TORCH_ARG(int64_t, heads) = 6;
  /// Embedding width (the residual stream's).
  TORCH_ARG(int64_t, width) = 384;
  /// The longest sequence (positions of the position embedding).
  TORCH_ARG(int64_t, context) = 256;
  /// Token ids: 256 for bytes.
  TORCH_ARG(int64_t, vocab_size) = 256;
  /// Dropout after the embeddings, inside attention, and after each
  /// residual branch, in training mode only; in [0, 1).
  TORCH_ARG(double, dropout) = 0.2;

 public:
  /// "gpt(layers=6, heads=6, width=384, context=256, vocab=256)": what a
  /// checkpoint stores as the model's name, so that a resume with another
  /// shape is refused naming both (dropout is not part of it).
  std::string name() const;
};

/// Multi-head causal self-attention: "c_attn" projects to queries, keys and
/// values at once, lamp::nn::scaled_dot_product_attention (the fused kernel
/// where this LibTorch has one, see lamp/nn/attention.h) attends causally,
/// "c_proj" projects back.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  /// Projections for `options`' width; its heads and dropout.
  explicit CausalSelfAttentionImpl(const GPTOptions& options);
  /// [B, T, width] -> [B, T, width].
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}; ///< width -> 3 * width
  torch::nn::Linear c_proj{nullptr}; ///< width -> width

 private:
  int64_t heads_;
  double dropout_;
};
/// The module holder of CausalSelfAttentionImpl.
TORCH_MODULE(CausalSelfAttention);

/// A pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)),
/// the MLP "mlp.c_fc" (width -> 4 width), GELU (exact, erf), "mlp.c_proj"
/// (4 width -> width).
class GPTBlockImpl : public torch::nn::Module {
 public:
  /// The block's modules for `options`' width and dropout.
  explicit GPTBlockImpl(const GPTOptions& options);
  /// [B, T, width] -> [B, T, width].
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr}; ///< before attention
  CausalSelfAttention attn{nullptr};  ///< causal self-attention
  torch::nn::LayerNorm ln_2{nullptr}; ///< before the MLP
  torch::nn::Linear c_fc{nullptr};    ///< registered as "mlp.c_fc"
  torch::nn::Linear c_proj{nullptr};  ///< registered as "mlp.c_proj"

 private:
  double dropout_;
};
/// The module holder of GPTBlockImpl.
TORCH_MODULE(GPTBlock);

/// The GPT: token and position embeddings ("wte", "wpe"), `layers` blocks
/// ("h.0" ...), a final LayerNorm ("ln_f") and the output projection tied to
/// the token embedding (logits = x wte^T: no parameter of its own).
///
/// Parameter names (a Python twin with these attributes loads its state dict
/// strictly): wte.weight, wpe.weight, h.N.ln_1.{weight,bias},
/// h.N.attn.c_attn.{weight,bias}, h.N.attn.c_proj.{weight,bias},
/// h.N.ln_2.{weight,bias}, h.N.mlp.c_fc.{weight,bias},
/// h.N.mlp.c_proj.{weight,bias}, ln_f.{weight,bias}.
///
/// Initialisation (GPT-2's): every Linear and Embedding weight from
/// N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj) from
/// N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorms 1 and 0; drawn from
/// the global generator (torch::manual_seed makes it repeatable).
///
/// Example:
/// \code
///   lamp::models::GPT gpt(lamp::models::GPTOptions().layers(4).context(128));
///   auto tokens = torch::randint(0, 256, {8, 128}, torch::kLong);
///   auto logits = gpt->forward(tokens);  // [8, 128, 256]
///   auto loss = torch::nn::functional::cross_entropy(
///       logits.flatten(0, 1), next_tokens.flatten());
/// \endcode
class GPTImpl : public torch::nn::Module {
 public:
  /// Throws c10::Error on a shape that cannot be built: a count below 1,
  /// `heads` not dividing `width`, dropout outside [0, 1).
  explicit GPTImpl(GPTOptions options = {});

  /// Token ids, integers [B, T] (int64 as a data::DeviceLoader with dtype
  /// kLong serves them), T <= context -> logits [B, T, vocab_size], in the
  /// parameters' dtype (or autocast's). Throws on a T above context, ids
  /// that are not integers and any other shape (lamp 0.4's [B, 1, 1, T]
  /// included). The ids must be below vocab_size (not checked here, which
  /// would wait for the device every step).
  torch::Tensor forward(const torch::Tensor& tokens);

  /// The shape it was built with.
  const GPTOptions& options() const { return options_; }

  torch::nn::Embedding wte{nullptr};  ///< token embedding, tied to the output
  torch::nn::Embedding wpe{nullptr};  ///< position embedding
  torch::nn::ModuleList h{nullptr};   ///< the GPTBlocks
  torch::nn::LayerNorm ln_f{nullptr}; ///< the final norm

 private:
  GPTOptions options_;
};
/// The module holder of GPTImpl.
TORCH_MODULE(GPT);

/// A GPT of `options` as a NamedModel (lamp/models/registry.h): the
/// module and its forward, for the programs and the benchmark.
NamedModel make_gpt(const GPTOptions& options);

/// The parameters a GPT of `options` holds (the output head shares wte's):
/// per block 12 width^2 + 13 width, then (vocab + context) width for the
/// embeddings and 2 width for the final norm. Computed without building the
/// model, so that a size too large for the memory is refused first; a count
/// beyond int64_t's range is refused (c10::Error).
int64_t gpt_parameter_count(const GPTOptions& options);

/// Floating-point operations of one training step (forward and backward)
/// per sequence of `context` tokens, by nanoGPT's estimate: per token
/// 6 N (N the parameters without the position embedding) plus 12 layers
/// context width for attention.
double gpt_training_flops(const GPTOptions& options);

/// Sampling options of generate().
struct GenerateOptions {
  /// New tokens to generate.
  TORCH_ARG(int64_t, tokens) = 200;
  /// Divides the logits before the softmax: below 1 sharper, above 1
  /// flatter; > 0.
  TORCH_ARG(double, temperature) = 0.8;
  /// Sample among the k most likely tokens only; 0 = all.
  TORCH_ARG(int64_t, top_k) = 0;
  /// The sampling generator's seed: the same seed, model and prompt give the
  /// same tokens.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Asked before every token: when it returns true, generate() stops there
  /// and returns the tokens so far (a program's SIGINT/SIGTERM flag). Unset:
  /// all `tokens`.
  TORCH_ARG(std::function<bool()>, stop_requested) = nullptr;
};

/// Extends `prompt` (int64 token ids [T0], T0 >= 1) by options.tokens()
/// tokens sampled from `forward` (a GPT's forward, or a converted model's)
/// one at a time, each from the logits of the last position over at most
/// the last `context` tokens. Runs without gradients with the module in
/// eval mode (restored after); the random draws come from a CPU generator
/// seeded with options.seed(), so the text does not depend on the device's
/// generator. Returns [T0 + tokens] int64 on the CPU (fewer tokens where
/// options.stop_requested() stopped it).
torch::Tensor generate(
    torch::nn::Module& module,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const torch::Tensor& prompt, int64_t context,
    const GenerateOptions& options = {});

} // namespace models
} // namespace lamp
