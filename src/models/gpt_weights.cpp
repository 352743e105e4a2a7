// A GPT's weights in the layouts of Python's GPTs: nanoGPT's model.py and
// Hugging Face's GPT2LMHeadModel, written (gpt_state_dict) and read
// (read_gpt_weights, load_gpt_weights).

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lamp/models/gpt.h"
#include "lamp/platform/checkpoint_file.h"

namespace lamp {
namespace models {
namespace {

constexpr const char* kTransformer = "transformer.";
constexpr const char* kHead = "lm_head.weight";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The blocks' weights that Hugging Face's Conv1D stores as [in, out].
bool is_conv1d_weight(const std::string& lamp_name) {
  return starts_with(lamp_name, "h.") &&
         (ends_with(lamp_name, ".attn.c_attn.weight") ||
          ends_with(lamp_name, ".attn.c_proj.weight") ||
          ends_with(lamp_name, ".mlp.c_fc.weight") ||
          ends_with(lamp_name, ".mlp.c_proj.weight"));
}

// Buffers of attention masks that some layouts store with the weights (Hugging
// Face's older GPT-2 files, nanoGPT's model without flash attention).
bool is_mask_buffer(const std::string& lamp_name) {
  return starts_with(lamp_name, "h.") &&
         (ends_with(lamp_name, ".attn.bias") ||
          ends_with(lamp_name, ".attn.masked_bias"));
}

std::string shape_text(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// Up to `most` names, then how many more.
std::string some_names(const std::vector<std::string>& names, size_t most = 4) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), most));
  std::string out = c10::Join(", ", shown);
  if (names.size() > most) {
    out += " and " + std::to_string(names.size() - most) + " more";
  }
  return out;
}

// The dict `value` holds a GPT's tensors in: the value itself, or a nanoGPT
// checkpoint's "model".
c10::impl::GenericDict tensors_of(const c10::IValue& value,
                                  const std::string& path) {
  const char* who = "lamp::models::read_gpt_weights";
  TORCH_CHECK(value.isGenericDict(), who, ": ", path, " holds a ",
              value.tagKind(),
              ", not a state dict; save a model's state_dict() (or nanoGPT's "
              "checkpoint) with torch.save.");
  auto dict = value.toGenericDict();
  if (dict.contains("model") && dict.at("model").isGenericDict()) {
    return dict.at("model").toGenericDict();
  }
  return dict;
}

// `name` without the prefixes torch.compile ("_orig_mod.") and DDP
// ("module.") add, in any order and number: nanoGPT wraps the compiled model
// in DDP, which gives "module._orig_mod.".
std::string without_wrapper_prefixes(std::string name) {
  for (;;) {
    if (starts_with(name, "_orig_mod.")) {
      name.erase(0, std::string("_orig_mod.").size());
    } else if (starts_with(name, "module.")) {
      name.erase(0, std::string("module.").size());
    } else {
      return name;
    }
  }
}

} // namespace

std::string gpt_layout_name(GPTLayout layout) {
  switch (layout) {
    case GPTLayout::kLamp:
      return "lamp";
    case GPTLayout::kNanoGPT:
      return "nanogpt";
    case GPTLayout::kHuggingFace:
      return "huggingface";
  }
  return "unknown";
}

namespace {

// The GPT that `module` is or holds (network_to_half's wrappers), or
// nullptr.
const GPTImpl* gpt_inside(const torch::nn::Module& module) {
  if (const auto* gpt = dynamic_cast<const GPTImpl*>(&module)) {
    return gpt;
  }
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (const auto* gpt = dynamic_cast<const GPTImpl*>(child.get())) {
      return gpt;
    }
  }
  return nullptr;
}

// What of `options` nanoGPT's or Hugging Face's GPT-2 computes otherwise,
// with the same tensors: "" where nothing does.
std::string runs_otherwise(const GPTOptions& options, GPTLayout layout) {
  if (options.norm() == GPTNorm::kRMSNorm) {
    return "RMSNorm, where " + gpt_layout_name(layout) +
           "'s GPT runs LayerNorm on the same weights";
  }
  if (layout == GPTLayout::kNanoGPT && options.gelu() == GPTGelu::kTanh) {
    return "the tanh GELU, where nanoGPT's MLP runs the exact one "
           "(nn.GELU())";
  }
  if (layout == GPTLayout::kHuggingFace && options.gelu() == GPTGelu::kExact) {
    return "the exact GELU, where Hugging Face's GPT-2 runs the tanh one "
           "unless its config's activation_function is \"gelu\"";
  }
  return "";
}

} // namespace

c10::Dict<std::string, torch::Tensor> gpt_state_dict(
    const torch::nn::Module& gpt, GPTLayout layout,
    const StateDictOptions& options) {
  if (const auto* model = gpt_inside(gpt);
      model != nullptr && layout != GPTLayout::kLamp) {
    const auto otherwise = runs_otherwise(model->options(), layout);
    if (!otherwise.empty()) {
      TORCH_WARN("lamp::models::gpt_state_dict: the model runs ", otherwise,
                 ": the ", gpt_layout_name(layout),
                 " state dict loads there, strictly, and computes other "
                 "outputs.");
    }
  }
  const auto own = python_state_dict(gpt, options);
  TORCH_CHECK(own.contains("wte.weight") && own.contains("wpe.weight"),
              "lamp::models::gpt_state_dict: the model is not a "
              "lamp::models::GPT (it has no wte.weight and wpe.weight).");
  if (layout == GPTLayout::kLamp) {
    return own;
  }
  c10::Dict<std::string, torch::Tensor> out;
  for (const auto& item : own) {
    auto tensor = item.value();
    if (layout == GPTLayout::kHuggingFace && is_conv1d_weight(item.key())) {
      tensor = tensor.t().contiguous();
    }
    out.insert(kTransformer + item.key(), tensor);
  }
  // The tied head: wte's tensor under a second name.
  out.insert(kHead, own.at("wte.weight"));
  return out;
}

void export_gpt_state_dict(const torch::nn::Module& gpt,
                           const std::string& path, GPTLayout layout,
                           const StateDictOptions& options) {
  check_checkpoint_path(path, "lamp::models::export_gpt_state_dict");
  save_pickle(gpt_state_dict(gpt, layout, options), path);
}

GPTWeights read_gpt_weights(const std::string& path) {
  const char* who = "lamp::models::read_gpt_weights";
  const auto value = load_pickle(path, who);
  const auto dict = tensors_of(value, path);
  GPTWeights out;
  out.path = path;
  // Names without the prefixes of torch.compile and DDP.
  std::map<std::string, torch::Tensor> named;
  bool prefixed = false;
  for (const auto& item : dict) {
    TORCH_CHECK(item.key().isString(), who, ": ", path,
                " has a key that is not a string (", item.key().tagKind(),
                "); a state dict's keys are parameter names.");
    const auto name = without_wrapper_prefixes(item.key().toStringRef());
    if (!item.value().isTensor()) {
      continue; // not a tensor: nothing of the model's
    }
    prefixed = prefixed || starts_with(name, kTransformer);
    const bool fresh = named.emplace(name, item.value().toTensor()).second;
    TORCH_CHECK(fresh, who, ": ", path, " holds ", name,
                " twice once the prefixes of torch.compile and DDP "
                "(_orig_mod., module.) are taken off (one of them is ",
                item.key().toStringRef(),
                "): two models' state dicts in one file; write one model's.");
  }
  // The head: tied to wte in every layout lamp reads.
  const auto head = named.find(kHead);
  torch::Tensor head_weight;
  if (head != named.end()) {
    head_weight = head->second;
    named.erase(head);
  }
  std::vector<std::string> foreign;
  for (const auto& item : named) {
    std::string name = item.first;
    if (prefixed) {
      if (!starts_with(name, kTransformer)) {
        foreign.push_back(name);
        continue;
      }
      name = name.substr(std::string(kTransformer).size());
    }
    if (is_mask_buffer(name)) {
      continue;
    }
    out.state.insert(name, item.second);
  }
  TORCH_CHECK(
      out.state.contains("wte.weight") && out.state.contains("wpe.weight"),
      who, ": ", path,
      " holds no GPT's embeddings (wte.weight and wpe.weight, under "
      "\"transformer.\" in nanoGPT's and Hugging Face's layouts); its tensors "
      "are ",
      named.empty() ? std::string("none") : [&] {
        std::vector<std::string> keys;
        for (const auto& item : named) {
          keys.push_back(item.first);
        }
        return some_names(keys);
      }(),
      ". Give a GPT's state_dict(), nanoGPT's ckpt.pt or a GPT-2 state dict.");
  TORCH_CHECK(foreign.empty(), who, ": ", path,
              " holds tensors outside a GPT's \"transformer.\" and "
              "\"lm_head.weight\": ",
              some_names(foreign),
              "; lamp's GPT has nothing to take them, so give the state dict "
              "of a nanoGPT or GPT-2 model alone.");
  const auto wte = out.state.at("wte.weight");
  const auto wpe = out.state.at("wpe.weight");
  TORCH_CHECK(wte.dim() == 2 && wpe.dim() == 2 && wte.size(1) == wpe.size(1),
              who, ": ", path, " has embeddings of shapes ", shape_text(wte),
              " (wte) and ", shape_text(wpe),
              " (wpe), not [vocab, width] and [context, width].");
  if (head_weight.defined()) {
    TORCH_CHECK(head_weight.sizes() == wte.sizes() &&
                    torch::equal(head_weight.to(wte.scalar_type()), wte),
                who, ": ", path,
                "'s lm_head.weight is not its transformer.wte.weight: the "
                "output head is untied from the token embedding, and lamp's "
                "GPT ties them (one tensor). Tie them in Python "
                "(model.lm_head.weight = model.transformer.wte.weight) "
                "before saving, or train the model in Python.");
  }
  const int64_t width = wte.size(1);
  // The layout: c_attn's weight is [3 width, width] as a Linear, [width,
  // 3 width] as Hugging Face's Conv1D (never both: width >= 1). The shape
  // decides with or without "transformer.": GPT2Model's state dict and the
  // gpt2 pytorch_model.bin have Conv1D weights under lamp's own names.
  bool conv1d = false;
  if (out.state.contains("h.0.attn.c_attn.weight")) {
    const auto c_attn = out.state.at("h.0.attn.c_attn.weight");
    conv1d = width >= 1 && c_attn.dim() == 2 && c_attn.size(0) == width &&
             c_attn.size(1) == 3 * width;
  }
  out.layout = conv1d     ? GPTLayout::kHuggingFace
               : prefixed ? GPTLayout::kNanoGPT
                          : GPTLayout::kLamp;
  if (out.layout == GPTLayout::kHuggingFace) {
    for (const auto& item : out.state) {
      if (is_conv1d_weight(item.key()) && item.value().dim() == 2) {
        out.state.insert_or_assign(item.key(), item.value().t());
      }
    }
  }
  // The shape the tensors give: the blocks h.0 to h.N, each with every
  // tensor any of them has (a block or a tensor left out would otherwise
  // read as a shallower model, or be blamed on the wrong blocks).
  int64_t layers = 0;
  std::set<std::string> block_tensors;
  std::set<std::pair<int64_t, std::string>> present;
  for (const auto& item : out.state) {
    const auto& key = item.key();
    const auto dot = key.find('.', 2);
    if (key.rfind("h.", 0) != 0 || dot == std::string::npos || dot == 2 ||
        key.find_first_not_of("0123456789", 2) != dot || dot - 2 > 6) {
      continue;
    }
    const int64_t block = std::stoll(key.substr(2, dot - 2));
    layers = std::max(layers, block + 1);
    block_tensors.insert(key.substr(dot + 1));
    present.emplace(block, key.substr(dot + 1));
  }
  TORCH_CHECK(out.state.contains("h.0.attn.c_attn.weight"), who, ": ", path,
              " holds embeddings but no transformer block "
              "(h.0.attn.c_attn.weight); it is not a GPT's state dict.");
  std::vector<std::string> absent;
  for (int64_t block = 0; block < layers; ++block) {
    for (const auto& tensor : block_tensors) {
      if (present.count({block, tensor}) == 0) {
        absent.push_back("h." + std::to_string(block) + "." + tensor);
      }
    }
  }
  TORCH_CHECK(absent.empty(), who, ": ", path, " holds blocks h.0 to h.",
              layers - 1, " with tensors missing: ", some_names(absent),
              "; the file is incomplete (a block or a tensor left out when "
              "it was written): write it again from the whole model.");
  out.options.layers(layers)
      .width(width)
      .vocab_size(wte.size(0))
      .context(wpe.size(0))
      .bias(out.state.contains("h.0.attn.c_attn.bias"));
  // nanoGPT's checkpoint says its heads (and bias) in "model_args".
  if (value.isGenericDict()) {
    const auto top = value.toGenericDict();
    if (top.contains("model_args") && top.at("model_args").isGenericDict()) {
      const auto args = top.at("model_args").toGenericDict();
      if (args.contains("n_head") && args.at("n_head").isInt()) {
        out.options.heads(args.at("n_head").toInt());
        out.heads_known = true;
      }
    }
  }
  return out;
}

void load_gpt_weights(GPTImpl& gpt, const GPTWeights& weights) {
  const char* who = "lamp::models::load_gpt_weights";
  const auto& path = weights.path;
  auto params = gpt.named_parameters();
  std::vector<std::string> missing, unexpected, other_shape;
  for (const auto& item : params) {
    if (!weights.state.contains(item.key())) {
      missing.push_back(item.key());
    }
  }
  for (const auto& item : weights.state) {
    const auto* param = params.find(item.key());
    if (param == nullptr) {
      unexpected.push_back(item.key());
      continue;
    }
    auto expected = param->sizes().vec();
    auto given = item.value().sizes().vec();
    // A shorter context takes wpe's first rows.
    const bool cropped = item.key() == "wpe.weight" && given.size() == 2 &&
                         expected.size() == 2 && given[1] == expected[1] &&
                         given[0] >= expected[0];
    if (given != expected && !cropped) {
      other_shape.push_back(item.key() + " " + shape_text(item.value()) +
                            " there, " + shape_text(*param) + " here");
    }
  }
  const auto model = gpt.options().name();
  // Heads shape no tensor: only a file that records them can be checked.
  TORCH_CHECK(
      !weights.heads_known || weights.options.heads() == gpt.options().heads(),
      who, ": ", path, " holds a GPT of ", weights.options.heads(),
      " attention heads, the model has ", gpt.options().heads(),
      "; build it with GPTOptions::heads(", weights.options.heads(), ").");
  TORCH_CHECK(other_shape.empty(), who, ": ", path, " (",
              gpt_layout_name(weights.layout), " layout) does not fit ", model,
              ": its tensors have other shapes: ", some_names(other_shape),
              ". Build the model with the file's shape (",
              weights.options.name(), " but the heads and dropout).");
  TORCH_CHECK(
      missing.empty() && unexpected.empty(), who, ": ", path, " (",
      gpt_layout_name(weights.layout), " layout) does not fit ", model, ":",
      missing.empty() ? "" : " missing " + some_names(missing) + ";",
      unexpected.empty() ? ""
                         : " not in the model " + some_names(unexpected) + ";",
      weights.options.bias() != gpt.options().bias()
          ? std::string(" the file was saved ") +
                (weights.options.bias() ? "with" : "without") +
                " biases: build the model with GPTOptions::bias(" +
                (weights.options.bias() ? "true" : "false") +
                ") (train_gpt: --bias " +
                (weights.options.bias() ? "true" : "false") + ")."
          : std::string(" build the model with the file's "
                        "options (its norm: a LayerNorm's bias, an "
                        "RMSNorm's none)."));
  torch::NoGradGuard no_grad;
  for (auto& item : params) {
    auto source = weights.state.at(item.key());
    if (item.key() == "wpe.weight") {
      source = source.slice(0, 0, item.value().size(0));
    }
    item.value().copy_(source);
  }
}

} // namespace models
} // namespace lamp
