#pragma once

/// \file
/// A decoder-only transformer (GPT) over bytes, in nanoGPT's layout: the
/// model of train_gpt and of lamp_bench --model gpt.

#include <ATen/core/Dict.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lamp/models/registry.h"
#include "lamp/models/state_dict.h"

namespace lamp {
namespace models {

/// The norm of a GPT's blocks and of its end.
enum class GPTNorm {
  kLayerNorm, ///< LayerNorm (GPT-2's, nanoGPT's)
  kRMSNorm,   ///< lamp::nn::RMSNorm: a weight, no bias, no mean subtracted
};

/// The GELU of a GPT's MLP.
enum class GPTGelu {
  kExact, ///< erf (nanoGPT's nn.GELU())
  kTanh,  ///< the tanh approximation (GPT-2's "gelu_new", Hugging Face's)
};

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
  /// Biases in every Linear and LayerNorm; false drops them all, as
  /// nanoGPT's `bias=False` (RMSNorm has none either way).
  TORCH_ARG(bool, bias) = true;
  /// The norm before attention, before the MLP and at the end (ln_1, ln_2,
  /// ln_f); both with eps 1e-5.
  TORCH_ARG(GPTNorm, norm) = GPTNorm::kLayerNorm;
  /// The MLP's GELU: GPT-2's own weights were trained with kTanh.
  TORCH_ARG(GPTGelu, gelu) = GPTGelu::kExact;
  /// Activation checkpointing, per block: in training with grad mode, each
  /// block keeps only its input for the backward, which runs the block's
  /// forward again (lamp::nn::activation_checkpoint(): same autocast state,
  /// same dropout masks; the gradients equal the uncheckpointed ones).
  /// About a third more compute for the blocks' activations' memory. Not
  /// part of name(): the weights and results are the same either way.
  TORCH_ARG(bool, activation_checkpointing) = false;
  /// GPTImpl::loss() computes the output head and the cross-entropy
  /// together, a chunk of positions at a time (lamp::ops::
  /// linear_cross_entropy()): the logits of the whole batch ([B, T,
  /// vocab], with their FP32 copy and log-probabilities) never exist, and
  /// the backward of the head is done in the same pass. The loss and
  /// gradients equal the unfused ones to rounding. forward() is unchanged.
  /// Off by default until a GPU run has measured it. Not part of name().
  TORCH_ARG(bool, fused_head_loss) = false;
  /// Each residual add runs with the norm after it (x + attention with
  /// ln_2, x + MLP with the next block's ln_1 or ln_f) as one operation
  /// (lamp::ops::add_layer_norm() / add_rms_norm()): on CUDA one kernel
  /// each way instead of an add, a norm and the cast to autocast's dtype.
  /// Under autocast the norms' outputs come in autocast's dtype (the bits
  /// the next linear would cast them to; an FP8 layer's cast then starts
  /// from those BF16 values), features() included. With
  /// activation checkpointing only the add inside each block is fused.
  /// The outputs and gradients equal the unfused ones to rounding. Off by
  /// default until a GPU run has measured it. Not part of name().
  TORCH_ARG(bool, fused_add_norm) = false;
  /// Each block's MLP runs as one operation with its biases and GELU in
  /// the matrix products' epilogues (lamp::ops::gelu_mlp()): on CUDA, with
  /// the tanh GELU (GPTGelu::kTanh) in 16-bit products, cuBLASLt adds the
  /// bias and applies the GELU as the first product writes and the GELU's
  /// derivative and the bias gradient as the backward's product writes, two
  /// passes over the 4-times-wide activation less each way. Elsewhere (the
  /// CPU, the exact GELU, FP32) the same ATen ops as the unfused MLP, the
  /// same results. An MLP whose layers are FP8 (convert_to_float8) runs
  /// unfused. Off by default until a GPU run has measured it. Not part of
  /// name().
  TORCH_ARG(bool, fused_mlp) = false;
  /// Under autocast, every block's Linear weights and biases are cast to
  /// autocast's dtype at the forward's start in one multi-tensor operation,
  /// and their gradients back to FP32 in one at the backward's end
  /// (lamp::nn::CastWeightsOnce), instead of a cast and a cast back per
  /// tensor as each layer runs: at 6 blocks with biases, 96 small kernels a
  /// step become 2. The same bits, forward and backward; the parameters'
  /// gradients all arrive at the backward's end. Not with activation
  /// checkpointing (its recomputation casts as autocast does). Off by
  /// default until a GPU run has measured it. Not part of name().
  TORCH_ARG(bool, fused_weight_cast) = false;
  /// Every block's Linear with a bias takes the bias's gradient from its
  /// weight-gradient product (lamp::ops::linear_bgrad(); in the fused MLP,
  /// GeluMlpOptions::fused_bias_grad): on CUDA in 16-bit products
  /// cuBLASLt sums it as the product reads the output's gradient, one
  /// reduction kernel and one pass over that gradient less per layer (24
  /// at 6 blocks). Elsewhere (the CPU, FP32) the same ATen ops as
  /// torch::linear's backward, the same results; on the fused path the
  /// bias gradients within a unit in the last place or so. FP8 layers and
  /// layers without a bias run as before. Off by default until a GPU run
  /// has measured it. Not part of name().
  TORCH_ARG(bool, fused_bias_grad) = false;

 public:
  /// "gpt(layers=6, heads=6, width=384, context=256, vocab=256)", with
  /// ", bias=false", ", norm=rmsnorm" and ", gelu=tanh" after it where they
  /// are not the defaults: what a checkpoint stores as the model's name, so
  /// that a resume with another shape is refused naming both (dropout is
  /// not part of it).
  std::string name() const;
};

class GPTImpl;

/// The keys and values a GPT's attention has computed for the tokens so
/// far, per block, so that each generated token costs one token's forward
/// instead of the whole window's (GPTImpl::set_kv_cache). Holds at most the
/// model's context; allocated at its first use in the keys' dtype (the
/// model's, or autocast's) and device.
///
/// Example (what generate() does):
/// \code
///   lamp::models::GPTKVCache cache(*gpt);
///   gpt->eval();
///   torch::NoGradGuard no_grad;  // forward() refuses the cache otherwise
///   gpt->set_kv_cache(&cache);
///   auto logits = gpt->forward(prompt);              // [1, T0, vocab]
///   logits = gpt->forward(next_token.view({1, 1}));  // position T0
///   gpt->set_kv_cache(nullptr);
/// \endcode
class GPTKVCache {
 public:
  /// An empty cache for `batch` sequences of `gpt`'s shape.
  explicit GPTKVCache(const GPTImpl& gpt, int64_t batch = 1);
  /// Tokens cached (the position the next token takes).
  int64_t length() const { return length_; }
  /// The most it holds: the model's context.
  int64_t capacity() const { return capacity_; }
  /// Forgets every token (the memory is kept).
  void clear() { length_ = 0; }

  /// Block `layer`'s keys and values of the new tokens ([B, heads, T,
  /// head width]) stored after the cached ones; returns all of them, [B,
  /// heads, length() + T, head width] (views). Used by the attention.
  std::pair<torch::Tensor, torch::Tensor> store(int64_t layer,
                                                const torch::Tensor& key,
                                                const torch::Tensor& value);
  /// Counts `tokens` more as cached, once every block has stored them.
  void advance(int64_t tokens);

 private:
  int64_t batch_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<torch::Tensor> keys_, values_;
};

/// Multi-head causal self-attention: "c_attn" projects to queries, keys and
/// values at once, lamp::nn::scaled_dot_product_attention (the fused kernel
/// where this LibTorch has one, see lamp/nn/attention.h) attends causally,
/// "c_proj" projects back.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  /// Projections for `options`' width; its heads and dropout. Throws
  /// c10::Error on heads or width below 1, heads not dividing the width,
  /// dropout outside [0, 1).
  explicit CausalSelfAttentionImpl(const GPTOptions& options);
  /// [B, T, width] -> [B, T, width].
  torch::Tensor forward(const torch::Tensor& x);
  /// The same for T tokens after the `cache`'s (at the positions after the
  /// cached ones), attending to the cached keys and values of block
  /// `layer` and storing its own there.
  torch::Tensor forward(const torch::Tensor& x, GPTKVCache& cache,
                        int64_t layer);

  torch::nn::Linear c_attn{nullptr}; ///< width -> 3 * width
  torch::nn::Linear c_proj{nullptr}; ///< width -> width

 private:
  /// The heads' outputs [B, heads, T, width / heads] joined, projected back
  /// by "c_proj" and dropped out in training: [B, T, width].
  torch::Tensor output(const torch::Tensor& y) const;

  int64_t heads_;
  double dropout_;
  bool fused_bias_grad_;
};
/// The module holder of CausalSelfAttentionImpl.
TORCH_MODULE(CausalSelfAttention);

/// A pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)),
/// the MLP "mlp.c_fc" (width -> 4 width), GELU (GPTOptions::gelu),
/// "mlp.c_proj" (4 width -> width). The norms are torch::nn::LayerNorm
/// (without its bias where GPTOptions::bias is false) or lamp::nn::RMSNorm,
/// held as AnyModule: `ln_1.ptr()` is the module.
class GPTBlockImpl : public torch::nn::Module {
 public:
  /// The block's modules for `options`' width and dropout. Throws
  /// c10::Error as CausalSelfAttentionImpl's constructor does.
  explicit GPTBlockImpl(const GPTOptions& options);
  /// [B, T, width] -> [B, T, width]; with a cache, attention as
  /// CausalSelfAttentionImpl's cached forward for block `layer`.
  torch::Tensor forward(torch::Tensor x, GPTKVCache* cache = nullptr,
                        int64_t layer = 0);
  /// The block as GPTOptions::fused_add_norm runs it, given x and
  /// `normed` = ln_1(x) (computed with the add before it): attention, its
  /// output added to x together with ln_2, the MLP. Returns {x plus
  /// attention, the MLP's output after dropout}: the caller adds the two
  /// with the next norm (forward() adds them alone).
  std::pair<torch::Tensor, torch::Tensor> forward_fused(
      const torch::Tensor& x, const torch::Tensor& normed,
      GPTKVCache* cache = nullptr, int64_t layer = 0);

  torch::nn::AnyModule ln_1;         ///< before attention
  CausalSelfAttention attn{nullptr}; ///< causal self-attention
  torch::nn::AnyModule ln_2;         ///< before the MLP
  torch::nn::Linear c_fc{nullptr};   ///< registered as "mlp.c_fc"
  torch::nn::Linear c_proj{nullptr}; ///< registered as "mlp.c_proj"

 private:
  // The MLP on ln_2's output, dropout applied.
  torch::Tensor mlp(const torch::Tensor& normed);

  double dropout_;
  GPTGelu gelu_;
  bool fused_add_norm_;
  bool fused_mlp_;
  bool fused_bias_grad_;
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
/// h.N.mlp.c_proj.{weight,bias}, ln_f.{weight,bias}; without the biases
/// where GPTOptions::bias is false or the norm is RMSNorm.
/// gpt_state_dict() gives them in nanoGPT's and Hugging Face's layouts.
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
  /// included), ids on another device than the model's, and (on the CPU)
  /// ids outside [0, vocab_size). A GPU's ids are not range-checked here,
  /// which would wait for the device every step.
  torch::Tensor forward(const torch::Tensor& tokens);

  /// What forward() computes before the output head: the final norm's
  /// output [B, T, width] (forward() is F::linear of it with wte's
  /// weight). The same checks and KV cache as forward().
  torch::Tensor features(const torch::Tensor& tokens);

  /// The next-token cross-entropy, an FP32 mean over every position:
  /// `targets` [B, T] (integers) are the tokens after `tokens`' [B, T].
  /// With GPTOptions::fused_head_loss, lamp::ops::linear_cross_entropy()
  /// of features() and wte's weight, else the head's logits and
  /// cross_entropy (what training::Task::language_model().loss() of
  /// forward() gives). The trainer's TrainerOptions::training_loss.
  /// Throws c10::Error when the targets' shape is not the tokens'.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  /// The shape it was built with.
  const GPTOptions& options() const { return options_; }

  /// Makes forward() continue the sequences `cache` holds: the tokens given
  /// take the positions after the cached ones and attend to them too, and
  /// are added to it; the logits are the same as the whole sequence's
  /// forward gives at those positions (to rounding). The cache must be of
  /// this model's shape and is not owned; nullptr turns caching off.
  /// forward() refuses tokens beyond the cache's capacity (clear it and
  /// give the last `context` tokens again), and the cache where gradients
  /// are on (its buffers are written in place: torch::NoGradGuard). Meant
  /// for generation in eval mode, one caller at a time.
  void set_kv_cache(GPTKVCache* cache) { cache_ = cache; }
  /// The cache set_kv_cache() gave, or nullptr.
  GPTKVCache* kv_cache() const { return cache_; }

  torch::nn::Embedding wte{nullptr}; ///< token embedding, tied to the output
  torch::nn::Embedding wpe{nullptr}; ///< position embedding
  torch::nn::ModuleList h{nullptr};  ///< the GPTBlocks
  torch::nn::AnyModule ln_f;         ///< the final norm (as GPTBlock's)

 private:
  // The blocks with GPTOptions::fused_add_norm, from the embeddings' sum x
  // to ln_f's output.
  torch::Tensor fused_blocks(torch::Tensor x);

  GPTOptions options_;
  GPTKVCache* cache_ = nullptr;
};
/// The module holder of GPTImpl.
TORCH_MODULE(GPT);

/// A GPT of `options` as a NamedModel (lamp/models/registry.h): the
/// module and its forward, for the programs and the benchmark.
NamedModel make_gpt(const GPTOptions& options);

/// The parameters a GPT of `options` holds (the output head shares wte's):
/// per block 12 width^2 + 13 width (12 width^2 + 2 width without biases),
/// then (vocab + context) width for the embeddings and 2 width for the final
/// norm (width without its bias). Computed without building the
/// model, so that a size too large for the memory is refused first; a count
/// beyond int64_t's range, and a negative layers, width, vocab_size or
/// context, is refused (c10::Error).
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
  /// flatter; > 0. The logits' maximum is subtracted first (the same
  /// distribution), so that however small the temperature nothing
  /// overflows: near 0 it samples the most likely token, as top_k 1 does.
  TORCH_ARG(double, temperature) = 0.8;
  /// Sample among the k most likely tokens only; 0 = all.
  TORCH_ARG(int64_t, top_k) = 0;
  /// Sample ids below this only: the tokenizer's vocabulary where the
  /// model's is padded beyond it (nanoGPT pads GPT-2's 50,257 ids to
  /// 50,304; train_gpt pads a meta.pkl's 65 to 128). The padded ids were
  /// never a target, have no text, and an undertrained model still gives
  /// them probability. 0 = every id of the logits. At most the logits'
  /// size (and the GPT's vocabulary).
  TORCH_ARG(int64_t, vocab_size) = 0;
  /// Sample among the most likely tokens whose probabilities sum to at
  /// least top_p (nucleus sampling), after top_k; 1 = all. In (0, 1].
  TORCH_ARG(double, top_p) = 1.0;
  /// With a lamp::models::GPT (or a model network_to_half() converted from
  /// one), keep its attention's keys and values (GPTKVCache) so that each
  /// token costs one token's forward; the tokens are those of the
  /// uncached forward (to rounding of the logits). Once the sequence
  /// outgrows the context, each token is computed over the last `context`
  /// tokens from scratch, as without the cache. Ignored for other models.
  TORCH_ARG(bool, kv_cache) = true;
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
/// the last `context` tokens (a longer prompt: its last `context` tokens).
/// With options.kv_cache() and a GPT inside `module`, `forward` is called
/// with the new tokens only while the GPT holds a GPTKVCache. Runs without
/// gradients with the module in
/// eval mode (restored after); the random draws come from a CPU generator
/// seeded with options.seed(), so the text does not depend on the device's
/// generator. Returns [T0 + tokens] int64 on the CPU (fewer tokens where
/// options.stop_requested() stopped it).
///
/// A GPTKVCache the caller set on the GPT (GPTImpl::set_kv_cache) is not
/// used: the GPT runs with generate()'s own cache, or with none, and the
/// caller's is set back when generate() returns or throws, unchanged (its
/// tokens and length as they were). Throws c10::Error, before any forward,
/// on the options out of their ranges (a vocab_size above the GPT's
/// vocabulary among them), on a prompt id outside [0, vocab)
/// (the GPT's vocabulary; ids below 0 for any model) and on a `context`
/// above the GPT's; and on logits that are not finite (a NaN or +inf, or
/// all -inf) at the position sampled from.
torch::Tensor generate(
    torch::nn::Module& module,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const torch::Tensor& prompt, int64_t context,
    const GenerateOptions& options = {});

/// The names and layouts of a GPT's state dict (gpt_state_dict()).
enum class GPTLayout {
  /// lamp's own module names: wte.weight, h.0.attn.c_attn.weight, ...
  kLamp,
  /// nanoGPT's model.py: "transformer." before lamp's names and the tied
  /// head as "lm_head.weight", so that nanoGPT's GPT loads it strictly.
  kNanoGPT,
  /// Hugging Face's GPT2LMHeadModel: nanoGPT's names, with the blocks'
  /// four projection weights (attn.c_attn, attn.c_proj, mlp.c_fc,
  /// mlp.c_proj) transposed, as its Conv1D stores them [in, out].
  kHuggingFace,
};

/// "lamp", "nanogpt" or "huggingface".
std::string gpt_layout_name(GPTLayout layout);

/// `gpt`'s parameters (a GPT, or a model network_to_half() converted from
/// one) as the state dict of `layout`, on the CPU, FP32 unless
/// `options.fp32()` is false; a tied tensor appears under both of its names
/// as one tensor (torch.save stores it once).
///
/// Example, then in Python with nanoGPT's model.py:
/// \code
///   lamp::models::export_gpt_state_dict(*gpt, "ckpt_weights.pt",
///                                        lamp::models::GPTLayout::kNanoGPT);
///   // model = GPT(GPTConfig(n_layer=6, n_head=6, n_embd=384,
///   //                       block_size=256, vocab_size=256, bias=True))
///   // model.load_state_dict(torch.load("ckpt_weights.pt"))
/// \endcode
c10::Dict<std::string, torch::Tensor> gpt_state_dict(
    const torch::nn::Module& gpt, GPTLayout layout,
    const StateDictOptions& options = {});

/// Writes gpt_state_dict() to `path` in torch.save's format, atomically.
void export_gpt_state_dict(const torch::nn::Module& gpt,
                           const std::string& path, GPTLayout layout,
                           const StateDictOptions& options = {});

/// A GPT's weights as a Python program saved them, and the shape they
/// imply.
struct GPTWeights {
  /// The file they were read from, for messages.
  std::string path;
  /// The tensors under lamp's names (kLamp), the head left out (it is
  /// wte's), Hugging Face's Conv1D weights transposed back.
  c10::Dict<std::string, torch::Tensor> state;
  /// The layout the file had: kHuggingFace wherever c_attn's weight is
  /// stored [width, 3 width] (Conv1D's), with or without "transformer."
  /// before the names; else kNanoGPT with the prefix, kLamp without.
  GPTLayout layout = GPTLayout::kLamp;
  /// The shape the tensors give: layers, width, context (wpe's rows),
  /// vocab_size (wte's rows) and bias; heads from a nanoGPT checkpoint's
  /// `model_args` only (see heads_known); the rest defaults.
  GPTOptions options;
  /// Whether the file said the heads (a nanoGPT checkpoint's n_head); a bare
  /// state dict does not.
  bool heads_known = false;
};

/// Reads a GPT's weights from `path`, a file of Python's torch.save (or
/// lamp's export): a state dict in lamp's, nanoGPT's or Hugging Face's
/// GPT-2 layout (told apart by the names and c_attn's shape; GPT-2's
/// weights also without "transformer.", as GPT2Model's state dict and
/// Hugging Face's gpt2 pytorch_model.bin hold them), or a nanoGPT
/// checkpoint (`ckpt.pt`: the state dict under "model", the shape under
/// "model_args"). Accepts the prefixes torch.compile and DDP add
/// ("_orig_mod.", "module.", in any order and number: nanoGPT's DDP of a
/// compiled model gives "module._orig_mod.") and ignores the attention-mask
/// buffers ("attn.bias", "attn.masked_bias") that some layouts store. Throws
/// c10::Error naming the file and the problem: not a torch.save file, no
/// GPT's tensors, an untied head (lm_head.weight other than wte.weight),
/// blocks with missing tensors, a name given twice (once the prefixes are
/// taken off).
GPTWeights read_gpt_weights(const std::string& path);

/// Copies `weights` into `gpt`, strictly: every parameter of `gpt` must be
/// there with its shape, and nothing else; a `gpt` whose context is shorter
/// than the file's takes wpe's first rows (nanoGPT's crop_block_size).
/// Throws c10::Error naming the tensors missing, unexpected or of another
/// shape (with both shapes), or other heads than the file records
/// (GPTWeights::heads_known), leaving `gpt` unchanged.
void load_gpt_weights(GPTImpl& gpt, const GPTWeights& weights);

} // namespace models
} // namespace lamp
