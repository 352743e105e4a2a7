// Trains a GPT (nanoGPT's layout) on a text's bytes or on nanoGPT's token
// files in any of lamp's precision modes, then prints a sample of its text:
//
//   train_gpt --precision amp-bf16 --layers 4 --heads 4 --width 128
//             --context 64 --steps 500 --eval-every 100
//   train_gpt --data nanoGPT/data/shakespeare_char --precision auto
//   train_gpt --data my_text.txt --precision auto --device cuda
//   train_gpt --init-from gpt2_state_dict.pt --heads 12 --gelu tanh
//             --context 256 --export-state-dict tuned.pt
#include <lamp/lamp.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/classifier_program.h"
#include "common/cli.h"
#include "common/gpt_kernels.h"
#include "common/nanogpt_config.h"
#include "common/stop_signals.h"

namespace {

// The text a sample continues where none is given.
constexpr const char* kDefaultPrompt = "\n";

// train_gpt's own flags: the model's shape and the sample's.
struct GptFlags {
  lamp::models::GPTOptions model;
  // The choices as typed (and as checkpoints store them); to_model_options()
  // turns them into `model`'s and export_layout.
  std::string bias = "true";
  std::string norm = "layernorm";
  std::string gelu = "exact";
  std::string layout = "nanogpt";
  lamp::models::GPTLayout export_layout = lamp::models::GPTLayout::kNanoGPT;
  CLI::App* app = nullptr; // which flags were given (and --init-from's shape)
  int64_t sample_tokens = 300;
  double temperature = 0.8;
  int64_t top_k = 0;
  double top_p = 1.0;
  std::string prompt = kDefaultPrompt;
  std::string prompt_file;
  int64_t num_samples = 1;
  std::vector<int64_t> prompt_ids;
  bool no_kv_cache = false;
  bool sample_only = false;
  // The data's text: bytes (a text file or folder), or token ids (token
  // files) with their vocabulary's pieces where meta.pkl gives them, and
  // the first validation token, the prompt when there is nothing to encode
  // one with (-1: none known).
  bool byte_text = true;
  lamp::data::TokenPieces pieces;
  int64_t first_token = -1;
  // The ids the samples are drawn from: the data's or the tokenizer's
  // vocabulary, below the model's padded one (0: every id, where the
  // text's vocabulary is not known).
  int64_t sample_vocab = 0;
  // --tokenizer: a SentencePiece model's file or a byte-level BPE's files
  // (the path stored in checkpoints), and the tokenizer once loaded (or
  // trained, with --train-tokenizer's pieces); it encodes the text and the
  // prompt and decodes the samples.
  std::string tokenizer_path;
  int64_t train_tokenizer = 0;
  lamp::data::Tokenizer tokenizer;
  // --init-from a lamp checkpoint: its path and its run's settings (the
  // tokenizer its model reads the ids of, what it trained on).
  std::string start_checkpoint;
  std::vector<lamp::training::ProgramSetting> start_settings;
};

void add_gpt_options(CLI::App& app, GptFlags& f) {
  const auto positive = lamp_examples::integer_in(1, int64_t{1} << 20);
  app.add_option("--layers", f.model.layers(), "transformer blocks, 1..1048576")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--heads", f.model.heads(),
                 "attention heads per block (dividing --width), 1..1048576")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--width", f.model.width(), "embedding width, 1..1048576")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--context", f.model.context(),
                 "tokens (bytes) per training sequence, and the longest the "
                 "model attends over, 1..1048576")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--dropout", f.model.dropout(),
                 "dropout in training, in [0, 1)")
      ->capture_default_str()
      ->check(lamp_examples::real_in(0.0, 1.0, /*lo_open=*/false,
                                     /*hi_open=*/true));
  app.add_option("--vocab-size", f.model.vocab_size(),
                 "token ids the model embeds and predicts (256: bytes; "
                 "token files: meta.pkl's vocab_size padded to a multiple of "
                 "64, or the tokenizer's when there is no meta.pkl; "
                 "--init-from a Python state dict: its wte's rows), "
                 "1..2147483648")
      ->capture_default_str()
      ->check(lamp_examples::integer_in(1, int64_t{1} << 31));
  app.add_option("--bias", f.bias,
                 "true | false: biases in the Linears and LayerNorms (false: "
                 "none, as nanoGPT's bias=False)")
      ->capture_default_str()
      ->check(CLI::IsMember({"true", "false"}));
  app.add_option("--norm", f.norm,
                 "layernorm | rmsnorm: the blocks' and the final norm")
      ->capture_default_str()
      ->check(CLI::IsMember({"layernorm", "rmsnorm"}));
  app.add_option("--gelu", f.gelu,
                 "exact | tanh: the MLP's GELU (erf, nanoGPT's; or the tanh "
                 "approximation GPT-2's own weights were trained with)")
      ->capture_default_str()
      ->check(CLI::IsMember({"exact", "tanh"}));
  app.add_option("--export-layout", f.layout,
                 "nanogpt | huggingface | lamp: the names of "
                 "--export-state-dict's file (nanoGPT's model.py loads "
                 "nanogpt strictly; huggingface is GPT2LMHeadModel's, its "
                 "Conv1D weights transposed; lamp the module's own)")
      ->capture_default_str()
      ->check(CLI::IsMember({"nanogpt", "huggingface", "lamp"}));
  app.add_option("--sample-tokens", f.sample_tokens,
                 "tokens (bytes of a text) to generate after training (0: "
                 "none; Ctrl-C stops it), 0..1048576")
      ->capture_default_str()
      ->check(lamp_examples::integer_in(0, int64_t{1} << 20));
  app.add_option("--temperature", f.temperature,
                 "the sample's temperature, in [0.001, 100]: below 1 surer, "
                 "above 1 wilder")
      ->capture_default_str()
      ->check(lamp_examples::real_in(1e-3, 100.0));
  app.add_option("--top-k", f.top_k,
                 "sample among the k most likely tokens only (0: all), "
                 "0..2147483648")
      ->capture_default_str()
      ->check(lamp_examples::integer_in(0, int64_t{1} << 31));
  app.add_option("--top-p", f.top_p,
                 "sample among the most likely tokens whose probabilities "
                 "first reach p (nucleus sampling), in (0, 1]; 1: all")
      ->capture_default_str()
      ->check(lamp_examples::real_in(0.0, 1.0, /*lo_open=*/true));
  app.add_option("--prompt", f.prompt,
                 "the text the sample continues (not empty)")
      ->capture_default_str();
  app.add_option("--prompt-file", f.prompt_file,
                 "a file whose text the sample continues (instead of "
                 "--prompt)")
      ->check(lamp_examples::non_empty_path("the file of the prompt"));
  app.add_option("--prompt-ids", f.prompt_ids,
                 "token ids the sample continues, comma-separated (instead "
                 "of --prompt: token files without a vocabulary's pieces, "
                 "such as GPT-2's)")
      ->delimiter(',')
      ->check(lamp_examples::integer_in(0, int64_t{1} << 31));
  app.add_option("--tokenizer", f.tokenizer_path,
                 "the tokenizer that encodes --data's text and the prompt "
                 "and decodes the samples: a SentencePiece model "
                 "(FILE.model), or a byte-level BPE such as GPT-2's, "
                 "GPT-4's or Llama 3's (tiktoken's gpt2.tiktoken or "
                 "cl100k_base.tiktoken, or Hugging Face's tokenizer.json, "
                 "vocab.json with merges.txt, or their folder) (default: "
                 "none, the text's bytes); with "
                 "--train-tokenizer, the SentencePiece model to write")
      ->check(lamp_examples::non_empty_path("the tokenizer"));
  app.add_option("--train-tokenizer", f.train_tokenizer,
                 "train a SentencePiece model of N pieces (BPE, byte "
                 "fallback) on the training part of --data's text and write "
                 "it to --tokenizer's file first; N in 260..1048576")
      ->check(lamp_examples::integer_in(260, int64_t{1} << 20));
  app.add_option("--num-samples", f.num_samples,
                 "samples to draw, the k-th with --seed + k, 1..1048576")
      ->capture_default_str()
      ->check(lamp_examples::integer_in(1, int64_t{1} << 20));
  app.add_flag("--activation-checkpointing", f.model.activation_checkpointing(),
               "keep only each block's input for the backward, which runs "
               "the block again (the same gradients; less memory, about a "
               "third more compute)");
  app.add_flag("--fused-head-loss", f.model.fused_head_loss(),
               "compute the output head and the cross-entropy together, a "
               "chunk of positions at a time, without the whole batch's "
               "logits (the same loss to rounding; less memory where the "
               "vocabulary is large)");
  app.add_flag("--fused-add-norm", f.model.fused_add_norm(),
               "run each residual add with the norm after it as one "
               "operation (one CUDA kernel each way on a GPU; the same "
               "results to rounding)");
  app.add_flag("--fused-mlp", f.model.fused_mlp(),
               "run each block's MLP with its biases and GELU in the matrix "
               "products' epilogues (cuBLASLt on a GPU, with --gelu tanh in "
               "16-bit products; the same results to rounding)");
  app.add_flag("--fused-weight-cast", f.model.fused_weight_cast(),
               "under autocast (amp-bf16, amp-fp16), cast the blocks' Linear "
               "weights in one multi-tensor operation a step and their "
               "gradients back in one, instead of one small kernel per "
               "tensor each way (the same results, bit for bit)");
  app.add_flag("--fused-bias-grad", f.model.fused_bias_grad(),
               "sum each Linear bias's gradient in its weight-gradient "
               "product (cuBLASLt's epilogue on a GPU in 16-bit products) "
               "instead of a reduction of its own (the same results to "
               "rounding; on a CPU, bit for bit)");
  app.add_flag("--no-kv-cache", f.no_kv_cache,
               "sample without the KV cache: every token computed over its "
               "whole window (slower; the same tokens)");
  app.add_flag("--sample-only", f.sample_only,
               "sample from --resume's checkpoint or --init-from's file, "
               "without training or writing anything");
}

// The tokenizer's identity in checkpoints (not its path, which may move):
// a SentencePiece model's pieces and its model file's CRC-32; a byte-level
// BPE's ids and the CRC-32 of every id's bytes, the same from each of its
// file formats (what the model's ids mean).
constexpr const char* kTokenizerModelSetting = "tokenizer model";

// What the run's ids are, in checkpoints: a text's bytes (kTextBytes: the
// samples draw ids 0..255 whatever --vocab-size), or token ids (token files
// or a tokenizer's). --sample-only then knows the bytes without --data's
// text, which may have moved.
constexpr const char* kTrainedOnSetting = "trained on";
constexpr const char* kTextBytes = "a text's bytes";
constexpr const char* kTokenIds = "token ids";

std::string tokenizer_fingerprint(const lamp::data::Tokenizer& tokenizer) {
  const auto& bpe = tokenizer.byte_pair();
  const auto bytes = bpe.empty() ? tokenizer.sentencepiece().serialized()
                                 : bpe.vocabulary_bytes();
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x",
                static_cast<unsigned>(lamp::crc32(bytes.data(), bytes.size())));
  return tokenizer.describe() +
         (bpe.empty() ? ", model crc32 " : ", vocabulary crc32 ") + crc;
}

// The settings of train_gpt's own that shape the run, by flag: stored in
// the checkpoint, so that --resume alone rebuilds the same model.
// "1,2,3": --prompt-ids as typed.
std::string joined_ids(const std::vector<int64_t>& ids) {
  std::string text;
  for (const auto id : ids) {
    text += (text.empty() ? "" : ",") + std::to_string(id);
  }
  return text;
}

std::vector<lamp::training::ProgramSetting> gpt_settings(const GptFlags& f) {
  const auto& m = f.model;
  return {
      {"--layers", std::to_string(m.layers())},
      {"--heads", std::to_string(m.heads())},
      {"--width", std::to_string(m.width())},
      {"--context", std::to_string(m.context())},
      {"--dropout", lamp_examples::exact_number(m.dropout())},
      {"--vocab-size", std::to_string(m.vocab_size())},
      {"--bias", f.bias},
      {"--norm", f.norm},
      {"--gelu", f.gelu},
      // Its path may change (a moved file); its model may not, which
      // train_gpt checks itself (load_tokenizer) to name the fix.
      {"--tokenizer", f.tokenizer_path, /*checked=*/false},
      {kTokenizerModelSetting,
       f.tokenizer.empty() ? std::string() : tokenizer_fingerprint(f.tokenizer),
       /*checked=*/false},
      {kTrainedOnSetting, f.byte_text ? kTextBytes : kTokenIds,
       /*checked=*/false},
      // The samples at the run's end: a resume draws them as the run it
      // continues would have (resume_sampling()).
      {"--sample-tokens", std::to_string(f.sample_tokens), false},
      {"--temperature", lamp_examples::exact_number(f.temperature), false},
      {"--top-k", std::to_string(f.top_k), false},
      {"--top-p", lamp_examples::exact_number(f.top_p), false},
      {"--num-samples", std::to_string(f.num_samples), false},
      {"--prompt", f.prompt, false},
      {"--prompt-file", f.prompt_file, false},
      {"--prompt-ids", joined_ids(f.prompt_ids), false}};
}

// The value `name` has in a checkpoint's settings; `found` false where
// they hold none (a checkpoint written before the setting was stored).
std::string setting_value(
    const std::vector<lamp::training::ProgramSetting>& settings,
    const std::string& name, bool& found) {
  found = false;
  std::string value;
  for (const auto& setting : settings) {
    if (setting.name == name) {
      found = true;
      value = setting.value;
    }
  }
  return value;
}

// setting_value() of the resumed checkpoint.
std::string resumed_setting(const lamp_examples::ProgramConfig& config,
                            const std::string& name, bool& found) {
  return setting_value(config.resumed_program_settings, name, found);
}

// The sample flags a resume takes back from its checkpoint where the
// command line does not give them: each number alone; the prompt (one of
// --prompt, --prompt-file and --prompt-ids) only where none is given, the
// one the run used.
const std::vector<std::string>& sample_settings() {
  static const std::vector<std::string> names = {
      "--sample-tokens", "--temperature", "--top-k",       "--top-p",
      "--num-samples",   "--prompt",      "--prompt-file", "--prompt-ids"};
  return names;
}

void resume_sampling(const lamp_examples::ProgramConfig& config,
                     GptFlags& flags) {
  if (config.resume.empty()) {
    return;
  }
  // Whether `name` was taken back: stored, not empty, not given. Not the
  // default prompt ("\n", stored where none was given): taken back, it
  // would count as given, which token files without pieces refuse (their
  // default is the first validation id). Not --sample-tokens 0 for
  // --sample-only, which is there to sample: its default, then.
  const auto take_back = [&](const std::string& name) {
    auto* option = flags.app->get_option(name);
    bool found = false;
    const auto value = resumed_setting(config, name, found);
    if (option->count() > 0 || value.empty() ||
        (name == "--prompt" && value == kDefaultPrompt) ||
        (name == "--sample-tokens" && value == "0" && flags.sample_only)) {
      return false;
    }
    option->clear();
    option->add_result(value);
    option->run_callback();
    return true;
  };
  for (const auto* name : {"--sample-tokens", "--temperature", "--top-k",
                           "--top-p", "--num-samples"}) {
    take_back(name);
  }
  for (const auto* name : {"--prompt", "--prompt-file", "--prompt-ids"}) {
    if (flags.app->get_option(name)->count() > 0) {
      return;
    }
  }
  for (const auto* name : {"--prompt-ids", "--prompt-file", "--prompt"}) {
    if (take_back(name)) {
      return;
    }
  }
}

// The text flags into the model's options, once the command line (and a
// resumed checkpoint's stored values) are in.
void to_model_options(GptFlags& f) {
  f.model.bias(f.bias == "true");
  f.model.norm(f.norm == "rmsnorm" ? lamp::models::GPTNorm::kRMSNorm
                                   : lamp::models::GPTNorm::kLayerNorm);
  f.model.gelu(f.gelu == "tanh" ? lamp::models::GPTGelu::kTanh
                                : lamp::models::GPTGelu::kExact);
  f.export_layout = f.layout == "huggingface"
                        ? lamp::models::GPTLayout::kHuggingFace
                    : f.layout == "lamp" ? lamp::models::GPTLayout::kLamp
                                         : lamp::models::GPTLayout::kNanoGPT;
}

// --init-from a Python file (nanoGPT's or GPT-2's weights): the model takes
// the file's shape, and a shape flag given with another value is refused.
// Returns the weights, to load once the model is built.
lamp::models::GPTWeights python_weights(lamp_examples::ProgramConfig& config,
                                        GptFlags& flags) {
  auto weights = lamp::models::read_gpt_weights(config.init_from);
  const auto& file = weights.options;
  auto& model = flags.model;
  const auto given = [&](const char* flag) {
    return flags.app->get_option(flag)->count() > 0;
  };
  std::string differences;
  const auto take = [&](const char* flag, int64_t there, int64_t& here,
                        bool may_be_smaller) {
    if (given(flag) && here != there && !(may_be_smaller && here < there)) {
      differences += std::string(differences.empty() ? "" : "; ") + flag + " " +
                     std::to_string(here) + " here, " + std::to_string(there) +
                     " there";
    }
    if (!given(flag)) {
      here = there;
    }
  };
  take("--layers", file.layers(), model.layers(), false);
  take("--width", file.width(), model.width(), false);
  take("--vocab-size", file.vocab_size(), model.vocab_size(), false);
  // A shorter context takes the position embedding's first rows.
  take("--context", file.context(), model.context(), true);
  if (weights.heads_known) {
    take("--heads", file.heads(), model.heads(), false);
  } else {
    TORCH_CHECK(given("--heads"), "--init-from ", config.init_from,
                " is a state dict, which does not record the attention "
                "heads of its ",
                file.layers(), " layers of width ", file.width(),
                "; give --heads (GPT-2 124M: 12; nanoGPT's ckpt.pt records "
                "them).");
  }
  if (given("--bias") && model.bias() != file.bias()) {
    differences += std::string(differences.empty() ? "" : "; ") + "--bias " +
                   (model.bias() ? "true" : "false") + " here, " +
                   (file.bias() ? "true" : "false") + " there";
  }
  model.bias(file.bias());
  flags.bias = file.bias() ? "true" : "false";
  TORCH_CHECK(
      differences.empty(), "--init-from ", config.init_from,
      " holds a GPT of another shape than the flags give: ", differences,
      ". Leave these flags out: the model takes the file's shape (a "
      "--context may be shorter).");
  return weights;
}

// --init-from a lamp checkpoint: the model reads the ids its run's did. A
// run with a tokenizer: the same tokenizer (its stored path where none is
// given and --data is no folder of token files; load_tokenizer() checks the
// model's fingerprint). A run on a text's bytes: bytes again, not a
// tokenizer's or token files' ids. A run on token files: token files again,
// or the tokenizer that made them; a text's bytes are refused (with
// --sample-only, --prompt-ids samples the ids). A checkpoint that does not
// store what it trained on (before lamp 0.5) is not checked.
void start_ids(const lamp_examples::ProgramConfig& config, GptFlags& flags,
               const std::vector<lamp::training::ProgramSetting>& settings) {
  flags.start_checkpoint = config.init_from;
  flags.start_settings = settings;
  bool found = false;
  const auto trained_on = setting_value(settings, kTrainedOnSetting, found);
  if (!found) {
    return;
  }
  const auto tokenizer = setting_value(settings, "--tokenizer", found);
  const auto model = setting_value(settings, kTokenizerModelSetting, found);
  const auto data = setting_value(settings, "--data", found);
  const bool token_folder = lamp::data::is_token_folder(config.data);
  const auto& from = config.init_from;
  if (!model.empty()) {
    TORCH_CHECK(flags.train_tokenizer == 0, "--init-from ", from,
                "'s model reads the ids of its run's tokenizer (", model,
                "); --train-tokenizer would make others. Leave it out: the "
                "model takes that tokenizer.");
    if (flags.tokenizer_path.empty() && !token_folder) {
      flags.tokenizer_path = tokenizer; // as the shape: the checkpoint's
    }
    return;
  }
  if (trained_on == kTextBytes) {
    TORCH_CHECK(flags.tokenizer_path.empty() && flags.train_tokenizer == 0 &&
                    !token_folder,
                "--init-from ", from,
                "'s model was trained on a text's bytes (ids 0..255), not on ",
                token_folder ? "token files' ids (--data " + config.data + ")"
                             : std::string("a tokenizer's ids"),
                ": give a text as --data, without --tokenizer, to train it on "
                "or sample its bytes.");
    flags.sample_vocab = 256; // never the model's padding ids
    return;
  }
  // Token files without a tokenizer stored.
  if (token_folder || !flags.tokenizer_path.empty() ||
      flags.train_tokenizer > 0) {
    return;
  }
  if (flags.sample_only && !flags.prompt_ids.empty()) {
    flags.byte_text = false; // ids in, ids out
    return;
  }
  TORCH_CHECK(false, "--init-from ", from,
              "'s model was trained on the token files of ",
              data.empty() ? std::string("another run") : data,
              ", whose ids are not a text's bytes (--data ", config.data,
              "): give --data a folder of token files made the same way, or "
              "--tokenizer the tokenizer that made them",
              flags.sample_only ? ", or --prompt-ids to sample ids" : "", ".");
}

// --init-from a lamp checkpoint of train_gpt: the model takes the shape its
// run stored (--layers, --heads, --width, --context, --vocab-size, --bias,
// --norm, --gelu), as from a Python file; a shape flag given with another
// value is refused, naming the flags to leave out. A checkpoint that stores
// no shape (written before lamp 0.5) is loaded as the flags give it.
void checkpoint_shape(const lamp_examples::ProgramConfig& config,
                      GptFlags& flags) {
  // Missing: said as --init-from's, not as the resume's the reader names.
  struct stat file {};
  TORCH_CHECK(::stat(config.init_from.c_str(), &file) == 0,
              "lamp: no checkpoint or state dict at ", config.init_from,
              " to start from (--init-from).");
  const auto checkpoint =
      lamp::training::read_checkpoint_settings(config.init_from);
  // train_gpt's models are named by their shape, "gpt(layers=...)"
  // (--sample-only names another model itself, in its terms).
  TORCH_CHECK(flags.sample_only || checkpoint.model_name.rfind("gpt(", 0) == 0,
              "--init-from ", config.init_from,
              " is a checkpoint of an image classifier (its "
              "model: ",
              checkpoint.model_name,
              "), not of a GPT; give a checkpoint train_gpt wrote, or a "
              "GPT's weights Python saved (nanoGPT's ckpt.pt, a state dict).");
  const auto now = gpt_settings(flags);
  std::string differences;
  for (const auto& setting : checkpoint.program_settings) {
    static const std::vector<std::string> shape = {
        "--layers",     "--heads", "--width", "--context",
        "--vocab-size", "--bias",  "--norm",  "--gelu"};
    if (std::find(shape.begin(), shape.end(), setting.name) == shape.end()) {
      continue;
    }
    auto* option = flags.app->get_option(setting.name);
    if (option->count() == 0) {
      option->clear();
      option->add_result(setting.value);
      option->run_callback();
      continue;
    }
    for (const auto& is : now) {
      if (is.name == setting.name && is.value != setting.value) {
        differences += std::string(differences.empty() ? "" : "; ") +
                       setting.name + " " + is.value + " here, " +
                       setting.value + " there";
      }
    }
  }
  TORCH_CHECK(
      differences.empty(), "--init-from ", config.init_from,
      " holds a GPT of another shape than the flags give: ", differences,
      ". Leave these flags out: the model takes the checkpoint's "
      "shape.");
  start_ids(config, flags, checkpoint.program_settings);
}

// The prompt's token ids: --prompt-ids; else --prompt-file's text, else
// --prompt's, as bytes or encoded with the data's pieces; else, for token
// files without pieces, the first validation token.
torch::Tensor prompt_ids(const GptFlags& flags) {
  const auto given = [&](const char* flag) {
    return flags.app != nullptr && flags.app->get_option(flag)->count() > 0;
  };
  TORCH_CHECK(!given("--prompt") || flags.prompt_file.empty(),
              "give one of --prompt and --prompt-file (the file's text is "
              "the prompt).");
  if (!flags.prompt_ids.empty()) {
    TORCH_CHECK(!given("--prompt") && flags.prompt_file.empty(),
                "give one of --prompt, --prompt-file and --prompt-ids.");
    for (const auto id : flags.prompt_ids) {
      TORCH_CHECK(id < flags.model.vocab_size(), "--prompt-ids holds ", id,
                  ", not below the model's vocabulary of ",
                  flags.model.vocab_size(), "; give ids the model knows.");
      // The model's padding ids (a vocabulary rounded up, as nanoGPT's
      // 50,304) stand for no text, and no sample draws them.
      TORCH_CHECK(flags.sample_vocab <= 0 || id < flags.sample_vocab,
                  "--prompt-ids holds ", id,
                  ", one of the model's padding ids: the data's are 0 ... ",
                  flags.sample_vocab - 1,
                  " (the ids above stand for no text); give ids of the "
                  "data.");
    }
    return torch::tensor(flags.prompt_ids, torch::kLong);
  }
  if (!flags.byte_text && flags.pieces.empty() && flags.tokenizer.empty()) {
    TORCH_CHECK(!given("--prompt") && flags.prompt_file.empty(),
                "the data's token ids come without their pieces (no "
                "meta.pkl with itos), so there is nothing to encode the "
                "prompt's text with; give --prompt-ids.");
    TORCH_CHECK(flags.first_token >= 0,
                "the data's token ids come without their pieces (no "
                "meta.pkl with itos): give the prompt as --prompt-ids.");
    return torch::tensor(std::vector<int64_t>{flags.first_token}, torch::kLong);
  }
  std::string prompt = flags.prompt;
  if (!flags.prompt_file.empty()) {
    struct stat st {};
    TORCH_CHECK(
        ::stat(flags.prompt_file.c_str(), &st) != 0 || !S_ISDIR(st.st_mode),
        "--prompt-file ", flags.prompt_file, " is a folder; give a text file.");
    std::ifstream file(flags.prompt_file, std::ios::binary);
    TORCH_CHECK(file.good(), "cannot read --prompt-file ", flags.prompt_file,
                ": ", std::strerror(errno), "; give a readable text file.");
    prompt.assign(std::istreambuf_iterator<char>(file),
                  std::istreambuf_iterator<char>());
    TORCH_CHECK(!prompt.empty(), "--prompt-file ", flags.prompt_file,
                " is empty; give a file with at least one character.");
  }
  if (!flags.tokenizer.empty()) {
    auto ids = flags.tokenizer.encode(prompt);
    // The default prompt is "\n": shown as the two characters.
    std::string shown;
    for (const char c : lamp::data::escape_text(prompt)) {
      shown += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    TORCH_CHECK(ids.size(0) > 0, "the prompt '", shown,
                "' encodes to no token with ", flags.tokenizer.origin(),
                " (a tokenizer that normalizes the text drops newlines and "
                "spaces); give --prompt with words in it.");
    return ids;
  }
  if (!flags.byte_text) {
    return flags.pieces.encode(prompt);
  }
  return torch::from_blob(const_cast<char*>(prompt.data()),
                          {static_cast<int64_t>(prompt.size())}, torch::kUInt8)
      .to(torch::kLong);
}

// The samples: --num-samples of --sample-tokens tokens after the prompt,
// the k-th drawn with --seed + k, shown as valid UTF-8 with other bytes
// escaped (lamp::data::escape_text) and ids beyond the bytes as <id>; a stop
// signal ends them at the next token. `forward` runs the model (the train
// step's forward after training, for its precision). Returns the tokens
// generated.
int64_t print_samples(
    const lamp_examples::ProgramConfig& config, const GptFlags& flags,
    torch::nn::Module& module,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  const auto ids = prompt_ids(flags);
  if (ids.size(0) > flags.model.context()) {
    lamp_examples::print_out(
        "train_gpt: the prompt's %lld tokens are more than the context of "
        "%lld: the samples continue its last %lld\n",
        static_cast<long long>(ids.size(0)),
        static_cast<long long>(flags.model.context()),
        static_cast<long long>(flags.model.context()));
  }
  int64_t generated = 0;
  for (int64_t k = 0; k < flags.num_samples; ++k) {
    if (lamp_examples::stop_signal() != 0) {
      break;
    }
    const uint64_t seed = config.seed + static_cast<uint64_t>(k);
    const auto text = lamp::models::generate(
        module, forward, ids, flags.model.context(),
        lamp::models::GenerateOptions()
            .tokens(flags.sample_tokens)
            .temperature(flags.temperature)
            .top_k(flags.top_k)
            .top_p(flags.top_p)
            .vocab_size(flags.sample_vocab)
            .kv_cache(!flags.no_kv_cache)
            .seed(seed)
            .stop_requested([] { return lamp_examples::stop_signal() != 0; }));
    std::string out;
    if (!flags.tokenizer.empty()) {
      out = flags.tokenizer.decode(text); // <id> beyond its pieces
    } else if (!flags.byte_text) {
      out = flags.pieces.decode(text); // <id> where there is no piece
    } else {
      const auto* p = text.data_ptr<int64_t>();
      for (int64_t i = 0; i < text.size(0); ++i) {
        // Ids beyond the bytes (a model of a larger --vocab-size, GPT-2's)
        // have no text without their tokenizer: shown as <id>.
        if (p[i] < 256) {
          out.push_back(static_cast<char>(p[i]));
        } else {
          out += "<" + std::to_string(p[i]) + ">";
        }
      }
    }
    const int64_t made = text.size(0) - ids.size(0);
    generated += made;
    std::string label = "sample";
    if (flags.num_samples > 1) {
      label += " " + std::to_string(k + 1) + " of " +
               std::to_string(flags.num_samples);
    }
    std::string settings = "--seed " + std::to_string(seed) +
                           ", --temperature " +
                           lamp_examples::exact_number(flags.temperature) +
                           ", --top-k " + std::to_string(flags.top_k);
    if (flags.top_p < 1.0) {
      settings += ", --top-p " + lamp_examples::exact_number(flags.top_p);
    }
    if (flags.sample_vocab > 0 &&
        flags.sample_vocab < flags.model.vocab_size()) {
      settings += ", ids 0.." + std::to_string(flags.sample_vocab - 1) +
                  " of the model's " + std::to_string(flags.model.vocab_size());
    }
    if (made < flags.sample_tokens) {
      settings += ", stopped by " +
                  std::string(lamp_examples::signal_name(
                      lamp_examples::stop_signal())) +
                  " after " + std::to_string(made) + " of " +
                  std::to_string(flags.sample_tokens) + " tokens";
    }
    lamp_examples::print_out("train_gpt: %s (%s):\n%s\n", label.c_str(),
                             settings.c_str(),
                             lamp::data::escape_text(out).c_str());
  }
  return generated;
}

// --tokenizer's model, loaded (the caller checks that the model's
// vocabulary holds its pieces); the text is then token ids, not bytes. A
// resumed run, or one started from a lamp checkpoint, takes the tokenizer
// its model was trained with, from wherever the file now is: a missing
// file or another model is refused.
void load_tokenizer(GptFlags& flags,
                    const lamp_examples::ProgramConfig& config) {
  // The checkpoint whose model the ids are for: --resume's, or --init-from's
  // lamp checkpoint (checkpoint_shape()).
  const bool resuming = !config.resume.empty();
  const auto& from = resuming ? config.resume : flags.start_checkpoint;
  const auto& settings =
      resuming ? config.resumed_program_settings : flags.start_settings;
  const auto setting = [&](const std::string& name, bool& found) {
    return setting_value(settings, name, found);
  };
  bool stored = false;
  const auto stored_path = setting("--tokenizer", stored);
  const bool resumed = resuming && stored;
  if (resumed) {
    TORCH_CHECK(!stored_path.empty(), "--tokenizer ", flags.tokenizer_path,
                " with --resume ", config.resume,
                ", a run trained without a tokenizer; leave out --tokenizer.");
  }
  if (stored && !stored_path.empty()) {
    TORCH_CHECK(std::ifstream(flags.tokenizer_path).good(), "--tokenizer ",
                flags.tokenizer_path, ", the tokenizer ", from,
                " was trained with, cannot be read: ", std::strerror(errno),
                "; where the file has moved, give --tokenizer PATH.");
  }
  flags.tokenizer = lamp::data::Tokenizer::load(flags.tokenizer_path);
  flags.byte_text = false;
  flags.sample_vocab = flags.tokenizer.vocab_size();
  bool fingerprinted = false;
  const auto stored_model = setting(kTokenizerModelSetting, fingerprinted);
  // (--init-from a run on token files: the tokenizer that made them may be
  // given, and there is nothing to compare it with.)
  if (fingerprinted && !stored_model.empty()) {
    const auto here = tokenizer_fingerprint(flags.tokenizer);
    TORCH_CHECK(here == stored_model, "--tokenizer ", flags.tokenizer_path,
                " is not the tokenizer ", from, " was trained with (", here,
                " here, ", stored_model,
                " there); give the file the run "
                "used (it was ",
                stored_path, ").");
  }
}

// The model's vocabulary for a tokenizer's ids (or a data's vocabulary of
// `vocab`): --vocab-size where given (or restored), at least `vocab`; else
// `vocab` padded to a multiple of 64, as nanoGPT pads GPT-2's.
void vocabulary_for(GptFlags& flags, int64_t vocab, bool vocab_given,
                    const std::string& what, const std::string& source) {
  if (!vocab_given) {
    flags.model.vocab_size(lamp::data::padded_vocab_size(vocab));
  }
  TORCH_CHECK(flags.model.vocab_size() >= vocab, "--vocab-size ",
              flags.model.vocab_size(), " is smaller than ", what, " of ",
              vocab, " (", source, "); give at least ", vocab,
              ", or leave --vocab-size out: the model then takes ",
              lamp::data::padded_vocab_size(vocab),
              " (padded to a multiple of 64).");
}

// The time to encode a text beyond which train_gpt names prepare_tokens.
constexpr double kEncodeOnceSeconds = 10.0;

// --train-tokenizer: a SentencePiece model of its pieces, trained on the
// training part of the text `bytes` (the part tokenized_text_windows()
// trains on, so that validation stays unseen), written to --tokenizer's
// file, which must not exist yet.
lamp::data::SentencePiece train_tokenizer(
    const lamp_examples::ProgramConfig& config, const GptFlags& flags,
    const torch::Tensor& bytes) {
  const auto& path = flags.tokenizer_path;
  TORCH_CHECK(!std::ifstream(path).good(), "--tokenizer ", path,
              " exists, and --train-tokenizer would replace it; leave out "
              "--train-tokenizer to use it, or give another --tokenizer "
              "file to write.");
  const int64_t split = lamp::data::text_split_point(bytes);
  lamp_examples::print_out(
      "train_gpt: training a tokenizer of %lld pieces on the first %lld "
      "bytes of %s (its training part)\n",
      static_cast<long long>(flags.train_tokenizer),
      static_cast<long long>(split), config.data.c_str());
  const auto start = std::chrono::steady_clock::now();
  const auto* p = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  auto tokenizer = lamp::data::train_sentencepiece(
      std::string(p, static_cast<size_t>(split)),
      lamp::data::SentencePieceTrainOptions().vocab_size(flags.train_tokenizer),
      "the training part of " + config.data);
  tokenizer.save(path);
  lamp_examples::print_out(
      "train_gpt: tokenizer written to %s in %.1f s (%s)\n", path.c_str(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      tokenizer.describe().c_str());
  // The file's model: what --resume and --sample-only will read.
  return lamp::data::SentencePiece::load(path);
}

// --sample-only's text where the run's --data (given, or stored in the
// checkpoint) is a folder of token files: meta.pkl's pieces, and the first
// validation token for a prompt. What cannot be read is left out (the
// samples then show ids, and --prompt-ids gives the prompt); pieces the
// model's vocabulary does not hold, or token files given for a model its
// run trained on a text's bytes, are refused (their text would not be the
// model's).
void token_text_for_sampling(const lamp_examples::ProgramConfig& config,
                             GptFlags& flags) {
  const auto& data = config.data;
  if (data.empty() || !lamp::data::is_token_folder(data)) {
    return;
  }
  bool stored = false;
  const auto run_data = resumed_setting(config, "--data", stored);
  struct stat st {};
  TORCH_CHECK(!stored || run_data == data || run_data.empty() ||
                  ::stat(run_data.c_str(), &st) != 0 ||
                  lamp::data::is_token_folder(run_data),
              "--sample-only: ", config.resume,
              "'s run trained on the text of ", run_data,
              " (its bytes), not on token files: the pieces of --data ", data,
              " would not give the model's text. Leave out --data.");
  flags.byte_text = false;
  int64_t vocab = flags.model.vocab_size();
  const auto meta = data + "/meta.pkl";
  if (std::ifstream(meta).good()) {
    lamp::data::TokenPieces pieces;
    int64_t meta_vocab = 0;
    try {
      meta_vocab = lamp::data::read_token_meta(meta, &pieces);
    } catch (const c10::Error&) {
      // Samples then show ids; the prompt must come from --prompt-ids.
    }
    if (meta_vocab > 0) {
      TORCH_CHECK(meta_vocab <= vocab, "--sample-only: ", meta,
                  " is a vocabulary of ", meta_vocab,
                  " pieces, more than the model's ", vocab,
                  ": its text would not be the model's. Give the --data "
                  "folder the model was trained on.");
      vocab = meta_vocab;
      flags.sample_vocab = meta_vocab;
      flags.pieces = std::move(pieces);
    }
  }
  try {
    const auto val = lamp::data::map_token_file(
        data + "/val.bin", lamp::data::token_id_bytes(vocab));
    flags.first_token =
        lamp::data::widen_token_ids(val[0], /*unsigned_ids=*/true)
            .item<int64_t>();
  } catch (const c10::Error&) {
    // Samples then show ids; the prompt must come from --prompt-ids.
  }
}

// --sample-only: the model of --resume's checkpoint or --init-from's file,
// its samples in the run's precision, and their speed; nothing is trained
// or written. Returns the exit status (128 + the signal that stopped it).
int sample_only(lamp_examples::ProgramConfig& config, GptFlags& flags,
                const std::shared_ptr<lamp::models::GPTWeights>& python) {
  const auto& source = !config.resume.empty()      ? config.resume
                       : !config.init_from.empty() ? config.init_from
                                                   : config.init_from_python;
  TORCH_CHECK(!source.empty(),
              "--sample-only samples from trained weights: give --resume "
              "CHECKPOINT (the shape comes with it) or --init-from FILE.");
  TORCH_CHECK(flags.sample_tokens > 0,
              "--sample-only with --sample-tokens 0 has nothing to do; give "
              "the tokens to generate.");
  const auto device = lamp_examples::resolve_device(config.device);
  TORCH_CHECK(flags.train_tokenizer == 0,
              "--sample-only trains nothing, a tokenizer neither; leave out "
              "--train-tokenizer (--tokenizer FILE decodes the samples).");
  token_text_for_sampling(config, flags);
  if (!flags.tokenizer_path.empty()) {
    load_tokenizer(flags, config);
    TORCH_CHECK(flags.tokenizer.vocab_size() <= flags.model.vocab_size(),
                "--tokenizer ", flags.tokenizer_path, " has ",
                flags.tokenizer.vocab_size(),
                " pieces, more than the model's vocabulary of ",
                flags.model.vocab_size(),
                "; give the tokenizer the model was trained with.");
  }
  // A model of fewer ids than the 256 bytes was trained on token files:
  // its ids read as bytes would be another alphabet's text.
  TORCH_CHECK(!flags.byte_text || !flags.tokenizer.empty() ||
                  flags.model.vocab_size() >= 256,
              "--sample-only: the model's vocabulary of ",
              flags.model.vocab_size(),
              " ids is not the bytes of a text (256), and --data ", config.data,
              " is no folder of token files to decode them with. Give --data "
              "the folder the model was trained on (its meta.pkl holds the "
              "pieces).");
  // A Python file's model (GPT-2's ids) with nothing to decode its ids: not
  // a text's bytes unless its vocabulary is theirs, or --data gives the
  // text it was trained on. Ids in, ids out.
  if (!python->path.empty() && flags.byte_text && flags.tokenizer.empty() &&
      flags.model.vocab_size() != 256 &&
      flags.app->get_option("--data")->count() == 0) {
    TORCH_CHECK(!flags.prompt_ids.empty(), "--sample-only: ", source,
                "'s model has a vocabulary of ", flags.model.vocab_size(),
                " ids, not a text's 256 bytes, and nothing here decodes its "
                "ids: give --tokenizer (GPT-2's tokenizer.json or vocab.json "
                "for GPT-2's weights), --data the token files (with their "
                "meta.pkl) or the text it was trained on, or --prompt-ids to "
                "sample ids.");
    flags.byte_text = false;
  }
  // A checkpoint of a run on a text's bytes: the bytes' ids, as the run's
  // own samples drew them, wherever its text is now. A Python file's model
  // (GPT-2's ids, --prompt-ids) draws from every id.
  if (flags.byte_text && flags.tokenizer.empty() && !config.resume.empty()) {
    bool stored = false;
    const auto run_data = resumed_setting(config, "--data", stored);
    bool known = false;
    const auto trained_on = resumed_setting(config, kTrainedOnSetting, known);
    struct stat st {};
    if (!known) {
      // Written before lamp stored it: a text that is still there says so.
      if (stored && !run_data.empty() && ::stat(run_data.c_str(), &st) == 0 &&
          !lamp::data::is_token_folder(run_data)) {
        flags.sample_vocab = 256;
      }
    } else if (trained_on == kTextBytes) {
      flags.sample_vocab = 256;
    } else {
      // Token files, and --data no folder of them (they have moved, or
      // --data names a text): their ids read as bytes would be another
      // text. As ids, with the prompt's ids given.
      TORCH_CHECK(!flags.prompt_ids.empty(), "--sample-only: ", config.resume,
                  "'s run trained on the token files of ", run_data,
                  ", whose ids are not a text's bytes, and --data ",
                  config.data,
                  " is no folder of token files. Give --data the folder they "
                  "are in now (its meta.pkl decodes the samples), or "
                  "--prompt-ids to sample ids.");
      flags.byte_text = false;
    }
  }
  lamp::models::GPT gpt(flags.model);
  if (!python->path.empty()) {
    lamp::models::load_gpt_weights(*gpt, *python);
  } else {
    const auto weights = lamp::training::read_checkpoint_weights(source);
    // Another GPT's shape is --resume's to take; another model no flag
    // makes a GPT of.
    const bool a_gpt = weights.model_name.rfind("gpt(", 0) == 0;
    TORCH_CHECK(weights.model_name == flags.model.name(),
                "--sample-only: ", source, " holds the model '",
                weights.model_name, "', not the flags' ", flags.model.name(),
                a_gpt ? "; give it with --resume, which takes its shape."
                      : ": it is no GPT. Give a checkpoint train_gpt wrote, "
                        "or a GPT's state dict (nanoGPT's ckpt.pt, GPT-2's "
                        "weights) to --init-from.");
    // The trainer's own loader: every parameter and buffer, by name and
    // shape.
    lamp::training::load_weights_from_checkpoint(*gpt, weights);
  }
  gpt->to(device);
  // The run's precision: autocast to its 16-bit type, from the FP32
  // weights the checkpoint keeps.
  auto precision = config.requested_precision;
  if (precision == lamp::Precision::kAuto) {
    precision = lamp::resolve_precision(precision, device);
  }
  c10::optional<torch::Dtype> dtype = lamp::autocast_dtype(precision);
  if (precision == lamp::Precision::kHalf) {
    dtype = torch::kHalf;
  } else if (precision == lamp::Precision::kBF16 ||
             precision == lamp::Precision::kFP8) {
    dtype = torch::kBFloat16;
  }
  // An FP16 run (amp, half) sampled where FP16 does not run (LibTorch 1.13's
  // CPU): the flag that samples it in another precision.
  TORCH_CHECK(
      dtype != torch::kHalf ||
          (lamp::fp16_compute_available(device) &&
           lamp::Autocast::is_supported(device.type(), torch::kHalf)),
      "--sample-only: precision '", lamp::to_string(precision), "' (",
      flags.app->get_option("--precision")->count() > 0 ? "given" : "the run's",
      ") runs FP16, which this LibTorch cannot run on ", device,
      "; give --precision fp32 (or amp-bf16) to sample in another "
      "precision from the same FP32 weights.");
  std::unique_ptr<lamp::Autocast> autocast;
  if (dtype) {
    autocast = std::make_unique<lamp::Autocast>(device.type(), *dtype);
  }
  lamp_examples::print_out(
      "train_gpt: sampling from %s: %s on %s, %s, KV cache %s\n",
      source.c_str(), flags.model.name().c_str(), device.str().c_str(),
      dtype ? (std::string("autocast ") + c10::toString(*dtype)).c_str()
            : "fp32",
      flags.no_kv_cache ? "off" : "on");
  const auto start = std::chrono::steady_clock::now();
  const int64_t generated =
      print_samples(config, flags, *gpt,
                    [&](const torch::Tensor& x) { return gpt->forward(x); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  lamp_examples::print_out(
      "train_gpt: %lld tokens in %.2f s: %.1f tokens/s (KV cache %s)\n",
      static_cast<long long>(generated), seconds,
      seconds > 0 ? static_cast<double>(generated) / seconds : 0.0,
      flags.no_kv_cache ? "off" : "on");
  const int signal = lamp_examples::stop_signal();
  return signal != 0 ? 128 + signal : 0;
}

} // namespace

int main(int argc, char** argv) {
  lamp_examples::ProgramConfig config;
  config.model = "gpt";
  config.dropped_on_resume = {"--train-tokenizer"};
  config.models = {"gpt"};
  // nanoGPT's character-level recipe (config/train_shakespeare_char.py):
  // 5000 steps, warm-up 100 then cosine to lr/10, evaluations of 200
  // batches every 250 steps, AdamW betas (0.9, 0.99).
  config.steps = 5000;
  config.schedule = "warmup-cosine";
  config.warmup_steps = 100;
  config.min_lr = 1e-4;
  config.eval_every = 250;
  config.limit_eval_batches = 200;
  config.checkpoint_every = 250;
  config.batch_size = 64;
  config.eval_batch_size = 64;
  config.optimizer = "adamw";
  config.lr = 1e-3;
  config.beta2 = 0.99;
  config.weight_decay = 0.1;
  config.no_bias_decay = true;
  config.max_grad_norm = 1.0;
  // nanoGPT's get_batch: the training windows at random offsets (on a
  // 180 KB text, 4 layers of 192 over 14 epochs, the validation loss
  // ended 0.10 below the fixed windows', whose model had begun to
  // overfit).
  config.windows = "random";
  config.data = lamp::data::default_text_path();
  config.data_may_be_file = true;
  config.examples = "sequences";
  GptFlags flags;
  config.program_settings = [&flags] { return gpt_settings(flags); };
  config.resumed_by_program = sample_settings();
  // nanoGPT's --key=value overrides, named by meaning, not spelling.
  lamp_examples::set_flag_hint(lamp_examples::nanogpt_flag_hint);
  return lamp_examples::program_main(
      argc, argv, "train_gpt",
      "Train a GPT on a text's bytes (default: Debian's fortunes) or on "
      "nanoGPT's token files (a folder with train.bin, val.bin and "
      "meta.pkl) with lamp, then print a sample of its text",
      config,
      [&] {
        if (!config.init_from.empty() &&
            !lamp::is_torch_save_file(config.init_from)) {
          checkpoint_shape(config, flags);
        }
        resume_sampling(config, flags);
        to_model_options(flags);
        // --init-from a Python file: its shape now, its weights once the
        // model is built; the trainer reads lamp's checkpoints only.
        auto python = std::make_shared<lamp::models::GPTWeights>();
        if (!config.init_from.empty() &&
            lamp::is_torch_save_file(config.init_from)) {
          TORCH_CHECK(config.resume.empty(),
                      "give --resume or --init-from, not both.");
          *python = python_weights(config, flags);
          config.init_from_python = config.init_from;
          config.init_from.clear();
        }
        if (config.eval_only) {
          TORCH_CHECK(!flags.sample_only,
                      "give --eval-only (the validation loss) or "
                      "--sample-only (samples), not both.");
          // The sample's flags, refused rather than ignored.
          lamp_examples::refuse_typed_flags(
              config,
              {"--sample-tokens", "--num-samples", "--prompt", "--prompt-file",
               "--prompt-ids", "--temperature", "--top-k", "--top-p",
               "--no-kv-cache", "--train-tokenizer"},
              "--eval-only samples and trains nothing");
        }
        if (flags.sample_only) {
          // What only training writes or uses, refused rather than ignored
          // (as typed: a resume gives some of them the checkpoint's values).
          lamp_examples::refuse_typed_flags(
              config, lamp_examples::training_only_flags(),
              "--sample-only trains and writes nothing");
          TORCH_CHECK(!flags.prompt.empty(),
                      "--prompt is empty; give at least one character.");
          lamp_examples::RunSpec spec;
          spec.instead_of_training = [&config, &flags, python] {
            return sample_only(config, flags, python);
          };
          return spec;
        }
        TORCH_CHECK(
            !config.data.empty(),
            "no --data given and Debian's fortunes are not installed "
            "(apt-get install fortunes); give --data FILE or FOLDER of text.");
        TORCH_CHECK(!config.channels_last,
                    "--channels-last is for images; train_gpt's inputs are "
                    "token ids. Leave it out.");
        TORCH_CHECK(!flags.prompt.empty(),
                    "--prompt is empty; give at least one character.");
        // --resume took the stored shape flags (gpt_settings); a checkpoint
        // of a model named otherwise is not train_gpt's.
        TORCH_CHECK(config.resume.empty() || config.model == "gpt" ||
                        config.model == flags.model.name(),
                    "--resume ", config.resume, " holds a '", config.model,
                    "' model, not a GPT of train_gpt; resume it with the "
                    "program that wrote it.");
        config.model = "gpt";
        lamp_examples::RunSpec spec;
        const bool token_files = lamp::data::is_token_folder(config.data);
        // Before either reader: a path that is gone (a data folder moved
        // since the run that --resume continues) is neither token files
        // nor a text, and the text's checks would name another flag.
        struct stat data_stat {};
        TORCH_CHECK(
            ::stat(config.data.c_str(), &data_stat) == 0 || errno != ENOENT,
            "--data ", config.data, " does not exist",
            config.resume.empty()
                ? std::string("; give a text file, a folder of them, or a "
                              "folder of token files (train.bin, val.bin).")
                : "; with --resume it is the checkpoint's data unless "
                  "given anew: give --data where the data is now.");
        // A nanoGPT data folder before its prepare.py ran: read as text, it
        // would train on input.txt, prepare.py and readme.md joined.
        struct stat prepare {};
        TORCH_CHECK(
            token_files ||
                ::stat((config.data + "/prepare.py").c_str(), &prepare) != 0,
            "--data ", config.data,
            " holds nanoGPT's prepare.py but no train.bin and val.bin: run "
            "it to make the token files, or give the text file itself "
            "(such as ",
            config.data, "/input.txt) to train on its bytes.");
        // JSON Lines read as a text train on the braces, the field names
        // and the escapes; prepare_tokens reads their documents.
        if (!token_files && lamp::data::text_documents_for(config.data) ==
                                lamp::data::TextDocuments::kJsonLines) {
          lamp_examples::print_out(
              "train_gpt: note: %s looks like JSON Lines, which train_gpt "
              "reads as one text, braces, field names and escapes too; to "
              "train on the documents' text, encode them with "
              "prepare_tokens --data %s --tokenizer FILE --out FOLDER, then "
              "give --data FOLDER\n",
              config.data.c_str(), config.data.c_str());
        }
        if (flags.train_tokenizer > 0) {
          TORCH_CHECK(!flags.tokenizer_path.empty(),
                      "--train-tokenizer needs --tokenizer FILE.model, the "
                      "file to write the tokenizer to.");
          TORCH_CHECK(config.resume.empty(),
                      "--train-tokenizer with --resume: a resumed run keeps "
                      "its checkpoint's tokenizer (--tokenizer ",
                      flags.tokenizer_path, "); leave out --train-tokenizer.");
          TORCH_CHECK(!token_files, "--data ", config.data,
                      " holds token files, already token ids; leave out "
                      "--train-tokenizer.");
          const char* world = std::getenv("WORLD_SIZE");
          TORCH_CHECK(world == nullptr || std::string(world) == "1",
                      "--train-tokenizer with ", world,
                      " ranks would have every rank write ",
                      flags.tokenizer_path,
                      ": make the tokenizer first in one process (docs/gpt.md "
                      "gives the spm_train command), then give --tokenizer "
                      "alone.");
        } else if (!flags.tokenizer_path.empty()) {
          load_tokenizer(flags, config);
        }
        const bool vocab_given =
            flags.app->get_option("--vocab-size")->count() > 0 ||
            !config.init_from_python.empty();
        if (token_files) {
          // nanoGPT's prepared data: the vocabulary comes with it (or
          // with the tokenizer that made the ids).
          auto tokens = lamp::data::read_token_files(
              config.data, flags.model.context(),
              vocab_given                ? flags.model.vocab_size()
              : !flags.tokenizer.empty() ? flags.tokenizer.vocab_size()
                                         : 0);
          vocabulary_for(
              flags, tokens.vocab_size, vocab_given, "the data's vocabulary",
              tokens.meta_path.empty() ? "--vocab-size" : tokens.meta_path);
          TORCH_CHECK(flags.tokenizer.empty() ||
                          flags.tokenizer.vocab_size() <= tokens.vocab_size,
                      "--tokenizer ", flags.tokenizer_path, " has ",
                      flags.tokenizer.vocab_size(),
                      " pieces, more than the data's vocabulary of ",
                      tokens.vocab_size,
                      ": it did not make these ids; give the tokenizer that "
                      "did, or none.");
          lamp_examples::print_out(
              "train_gpt: token files %s: %lld training and %lld validation "
              "tokens (%s), a vocabulary of %lld%s; the model's %lld%s\n",
              config.data.c_str(), static_cast<long long>(tokens.train_tokens),
              static_cast<long long>(tokens.validation_tokens),
              tokens.id_bytes == 2 ? "uint16" : "uint32",
              static_cast<long long>(tokens.vocab_size),
              !tokens.meta_path.empty()
                  ? (tokens.pieces.empty() ? " (meta.pkl)"
                                           : " (meta.pkl, with its pieces)")
              : flags.tokenizer.empty() ? " (--vocab-size)"
                                        : " (--tokenizer)",
              static_cast<long long>(flags.model.vocab_size()),
              vocab_given ? "" : " (padded to a multiple of 64)");
          flags.byte_text = false;
          flags.sample_vocab = tokens.vocab_size;
          flags.pieces = std::move(tokens.pieces);
          flags.first_token =
              lamp::data::widen_token_ids(tokens.validation.inputs[0][0],
                                          tokens.validation.unsigned_ids)
                  .item<int64_t>();
          spec.train = std::move(tokens.train);
          spec.test = std::move(tokens.validation);
        } else if (!flags.tokenizer_path.empty()) {
          // Raw text through the tokenizer.
          const auto bytes = lamp::data::read_text_bytes(config.data);
          if (flags.train_tokenizer > 0) {
            flags.tokenizer = train_tokenizer(config, flags, bytes);
            flags.byte_text = false;
            flags.sample_vocab = flags.tokenizer.vocab_size();
          }
          vocabulary_for(flags, flags.tokenizer.vocab_size(), vocab_given,
                         "the tokenizer's pieces",
                         "--tokenizer " + flags.tokenizer_path);
          const auto encode_start = std::chrono::steady_clock::now();
          auto text = lamp::data::tokenized_text_windows(
              bytes, config.data, flags.tokenizer, flags.model.context());
          const double encode_seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            encode_start)
                  .count();
          lamp_examples::print_out(
              "train_gpt: text %s: %lld bytes, encoded by %s (%s) into %lld "
              "training and %lld validation tokens (%.2f bytes a token); the "
              "model's vocabulary %lld%s\n",
              config.data.c_str(), static_cast<long long>(text.bytes),
              flags.tokenizer_path.c_str(), flags.tokenizer.describe().c_str(),
              static_cast<long long>(text.train_tokens),
              static_cast<long long>(text.validation_tokens),
              static_cast<double>(text.bytes) /
                  static_cast<double>(text.train_tokens +
                                      text.validation_tokens),
              static_cast<long long>(flags.model.vocab_size()),
              vocab_given ? "" : " (padded to a multiple of 64)");
          // A text that takes a while to encode is encoded again at every
          // start: say how to do it once.
          if (encode_seconds >= kEncodeOnceSeconds) {
            lamp_examples::print_out(
                "train_gpt: encoding took %.1f s, and takes it at every "
                "start; encode it once, on every core, with prepare_tokens "
                "--data %s --tokenizer %s --out FOLDER, then train_gpt "
                "--data FOLDER (docs/gpt.md, \"Token files from text\")\n",
                encode_seconds, config.data.c_str(),
                flags.tokenizer_path.c_str());
          }
          spec.train = std::move(text.train);
          spec.test = std::move(text.validation);
        } else {
          TORCH_CHECK(flags.model.vocab_size() >= 256, "--vocab-size ",
                      flags.model.vocab_size(),
                      " is smaller than the text's 256 byte values; give at "
                      "least 256.");
          flags.sample_vocab = 256; // the bytes of a text
          auto text =
              lamp::data::read_text_windows(config.data, flags.model.context());
          spec.train = std::move(text.train);
          spec.test = std::move(text.validation);
        }
        if (!config.eval_only && flags.sample_tokens > 0) {
          // A bad prompt is refused before training; --eval-only and
          // --sample-tokens 0 sample nothing (the default prompt may encode
          // to no token with the tokenizer).
          prompt_ids(flags);
        }
        const auto name = flags.model.name();
        config.sequence_length = flags.model.context();
        config.flops_per_example =
            lamp::models::gpt_training_flops(flags.model);
        spec.data_files = {config.data};
        if (!flags.tokenizer_path.empty()) {
          spec.data_files.push_back(flags.tokenizer_path);
        }
        if (!config.init_from_python.empty()) {
          spec.data_files.push_back(config.init_from_python);
        }
        spec.model_name = name;
        spec.parameters = lamp::models::gpt_parameter_count(flags.model);
        spec.size_flags = "--width, --layers or --context";
        spec.task = lamp::training::Task::language_model();
        const auto options = flags.model;
        spec.make_model = [options, python](const std::string&,
                                            const std::string&) {
          auto built = lamp::models::make_gpt(options);
          if (!python->path.empty()) {
            lamp::models::load_gpt_weights(
                *std::dynamic_pointer_cast<lamp::models::GPTImpl>(built.module),
                *python);
          }
          return built;
        };
        const auto layout = flags.export_layout;
        spec.export_weights =
            [layout](const torch::nn::Module& module, const std::string& path,
                     const lamp::models::StateDictOptions& o) {
              lamp::models::export_gpt_state_dict(module, path, layout, o);
            };
        if (flags.model.fused_add_norm() || flags.model.fused_mlp() ||
            flags.model.fused_weight_cast() || flags.model.fused_bias_grad() ||
            config.fp8_fused_casts) {
          spec.kernel_note =
              [model = flags.model, fused_casts = config.fp8_fused_casts](
                  const torch::Device& device, lamp::Precision precision) {
                std::string note;
                for (const auto& line : lamp_examples::gpt_kernel_notes(
                         model, device, precision, fused_casts)) {
                  note += (note.empty() ? "" : "\n") + line;
                }
                return note;
              };
        }
        spec.after_training = [&](const lamp_examples::BuiltModel& model,
                                  lamp::training::Trainer& trainer) {
          if (flags.sample_tokens > 0) {
            auto& step = trainer.train_step();
            print_samples(config, flags, *model.module,
                          [&](const torch::Tensor& x) {
                            return step.forward(model.forward, x);
                          });
          }
        };
        return spec;
      },
      [&](CLI::App& app) {
        add_gpt_options(app, flags);
        flags.app = &app;
        app.add_option(
               "--windows", config.windows,
               "random | fixed: the training sequences start at random "
               "offsets of the text, as nanoGPT's get_batch draws them "
               "(random), or are windows of --context tokens that follow "
               "each other, shuffled each epoch (fixed: each token a target "
               "once an epoch); validation always takes the fixed windows in "
               "order")
            ->capture_default_str()
            ->check(CLI::IsMember({"fixed", "random"}));
        app.add_option(
               "--peak-tflops", config.peak_tflops,
               "the device's peak TFLOP/s for the precision, for MFU (model "
               "FLOPs utilisation) in the epoch line and log: known for H100, "
               "H200 and A100 (their datasheets' dense peaks), needed for a "
               "CPU or another GPU (default 0: the table's, or no MFU)")
            ->check(lamp_examples::non_negative_real());
      },
      lamp_examples::nanogpt_config_flags);
}
