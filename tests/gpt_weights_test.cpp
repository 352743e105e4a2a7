// A GPT's weights in Python's layouts: files that Python programs saved
// (tests/python/gpt_weights, written by tests/python/make_gpt_weights.py:
// nanoGPT's state dict and checkpoint, Hugging Face's GPT-2 layout) load
// and give Python's logits; lamp's exports read back bit for bit; what does
// not fit is refused naming the tensors.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "lamp/platform/warnings.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::models::GPT;
using lamp::models::GPTGelu;
using lamp::models::GPTLayout;
using lamp::models::GPTNorm;
using lamp::models::GPTOptions;
using lamp_test::error_of;
using lamp_test::temp_path;

std::string fixture(const std::string& name) {
  return std::string(LAMP_SOURCE_DIR) + "/tests/python/gpt_weights/" + name;
}

// The fixtures' shape (make_gpt_weights.py): 2 layers, 2 heads, width 8,
// context 8, 16 token ids.
GPTOptions fixture_shape() {
  return GPTOptions()
      .layers(2)
      .heads(2)
      .width(8)
      .context(8)
      .vocab_size(16)
      .dropout(0);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every parameter of `gpt` moved off its initial value (so that a wrong
// copy shows).
void perturb(GPT& gpt) {
  torch::NoGradGuard no_grad;
  for (auto& p : gpt->parameters()) {
    p.add_(torch::randn_like(p) * 0.1);
  }
}

void expect_same_parameters(GPT& a, GPT& b) {
  auto pb = b->named_parameters();
  ASSERT_EQ(a->named_parameters().size(), pb.size());
  for (const auto& item : a->named_parameters()) {
    ASSERT_NE(pb.find(item.key()), nullptr) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
}

// Each file Python saved loads with its layout and shape told from the
// file, and the model then computes Python's logits on Python's tokens.
TEST(GptWeights, PythonFilesGivePythonsLogits) {
  const auto expected =
      lamp::load_pickle(fixture("expected.pt"), "test").toGenericDict();
  const auto tokens = expected.at("tokens").toTensor();
  struct Case {
    const char* file;
    GPTLayout layout;
    bool bias;
    bool heads_known;
    GPTGelu gelu;
  };
  for (const auto& c :
       {Case{"nanogpt_state_dict.pt", GPTLayout::kNanoGPT, true, false,
             GPTGelu::kExact},
        Case{"nanogpt_ckpt.pt", GPTLayout::kNanoGPT, false, true,
             GPTGelu::kExact},
        Case{"huggingface_state_dict.pt", GPTLayout::kHuggingFace, true, false,
             GPTGelu::kTanh}}) {
    SCOPED_TRACE(c.file);
    const auto weights = lamp::models::read_gpt_weights(fixture(c.file));
    EXPECT_EQ(weights.layout, c.layout);
    EXPECT_EQ(weights.heads_known, c.heads_known);
    const auto& o = weights.options;
    EXPECT_EQ(o.layers(), 2);
    EXPECT_EQ(o.width(), 8);
    EXPECT_EQ(o.context(), 8);
    EXPECT_EQ(o.vocab_size(), 16);
    EXPECT_EQ(o.bias(), c.bias);
    if (c.heads_known) {
      EXPECT_EQ(o.heads(), 2);
    }
    // The attention masks of Hugging Face's file are not weights.
    EXPECT_FALSE(weights.state.contains("h.0.attn.bias"));
    GPT gpt(fixture_shape().bias(c.bias).gelu(c.gelu));
    lamp::models::load_gpt_weights(*gpt, weights);
    gpt->eval();
    torch::NoGradGuard no_grad;
    const auto logits = gpt->forward(tokens);
    const auto python = expected.at(c.file).toTensor();
    // FP32 on both sides, sums of at most 32 products in another order:
    // 1e-5 of logits of size about 1 (measured: below 1e-6).
    EXPECT_TRUE(lamp_test::AllClose(logits, python, 1e-4, 1e-5))
        << (logits - python).abs().max().item<double>();
  }
}

// Tensors that are views of a larger storage, as torch.save keeps them,
// in an OrderedDict (which only lamp's reader reads): their offset and
// strides are read, not only their storage.
TEST(GptWeights, PythonViewsKeepTheirOffsetAndStrides) {
  const auto expected =
      lamp::load_pickle(fixture("views.pt"), "test").toGenericDict();
  EXPECT_TRUE(torch::equal(expected.at("offset_view").toTensor(),
                           torch::arange(3, 7, torch::kFloat)));
  EXPECT_TRUE(torch::equal(expected.at("strided_view").toTensor(),
                           torch::arange(12, torch::kFloat).view({3, 4}).t()));
}

// lamp's exports in the three layouts read back to the same tensors, bit
// for bit, into a model of other weights; the nanoGPT and Hugging Face
// names are lamp's under "transformer." with the tied head beside them,
// and Hugging Face's four projection weights are transposed.
TEST(GptWeights, ExportsReadBackBitForBitInEveryLayout) {
  const auto options = fixture_shape().bias(false).norm(GPTNorm::kRMSNorm);
  torch::manual_seed(3);
  GPT source(options);
  perturb(source);
  const auto own = source->named_parameters();
  for (const auto layout :
       {GPTLayout::kLamp, GPTLayout::kNanoGPT, GPTLayout::kHuggingFace}) {
    SCOPED_TRACE(lamp::models::gpt_layout_name(layout));
    const auto dict = lamp::models::gpt_state_dict(*source, layout);
    const std::string prefix = layout == GPTLayout::kLamp ? "" : "transformer.";
    EXPECT_EQ(dict.size(), own.size() + (layout == GPTLayout::kLamp ? 0 : 1));
    for (const auto& item : own) {
      const auto key = prefix + item.key();
      ASSERT_TRUE(dict.contains(key)) << key;
      const bool transposed = layout == GPTLayout::kHuggingFace &&
                              (contains(item.key(), "attn.c_attn.weight") ||
                               contains(item.key(), "attn.c_proj.weight") ||
                               contains(item.key(), "mlp.c_fc.weight") ||
                               contains(item.key(), "mlp.c_proj.weight"));
      EXPECT_TRUE(torch::equal(dict.at(key),
                               transposed ? item.value().t() : item.value()))
          << key;
    }
    if (layout != GPTLayout::kLamp) {
      // The head is wte's tensor itself, so that torch.save stores it once.
      EXPECT_TRUE(
          dict.at("lm_head.weight").is_same(dict.at("transformer.wte.weight")));
    }
    const auto path =
        temp_path("gpt_" + lamp::models::gpt_layout_name(layout) + ".pt");
    lamp::models::export_gpt_state_dict(*source, path, layout);
    const auto weights = lamp::models::read_gpt_weights(path);
    // lamp's own names are nanoGPT's without the prefix: read as such.
    EXPECT_EQ(weights.layout, layout);
    EXPECT_EQ(weights.options.bias(), false);
    torch::manual_seed(4);
    GPT copy(options);
    lamp::models::load_gpt_weights(*copy, weights);
    expect_same_parameters(source, copy);
    std::remove(path.c_str());
  }
}

// `dict` written with torch.save's format, read back.
lamp::models::GPTWeights saved_and_read(
    const c10::Dict<std::string, torch::Tensor>& dict,
    const std::string& name) {
  const auto path = temp_path(name);
  lamp::save_pickle(dict, path);
  auto weights = lamp::models::read_gpt_weights(path);
  std::remove(path.c_str());
  return weights;
}

// `source`'s weights in `weights` give `source`'s logits.
void expect_loads_as(GPT& source, const lamp::models::GPTWeights& weights) {
  torch::manual_seed(4);
  GPT copy(source->options());
  lamp::models::load_gpt_weights(*copy, weights);
  expect_same_parameters(source, copy);
  source->eval();
  copy->eval();
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 16, {2, 8}, torch::kLong);
  EXPECT_TRUE(torch::equal(copy->forward(tokens), source->forward(tokens)));
}

// The state dict of nanoGPT's DDP-wrapped compiled model ("module." before
// "_orig_mod.", the order nanoGPT's train.py wraps in) reads as nanoGPT's.
TEST(GptWeights, DdpOfACompiledModelReadsAsNanoGpts) {
  torch::manual_seed(7);
  GPT source(fixture_shape());
  perturb(source);
  c10::Dict<std::string, torch::Tensor> wrapped;
  for (const auto& item :
       lamp::models::gpt_state_dict(*source, GPTLayout::kNanoGPT)) {
    wrapped.insert("module._orig_mod." + item.key(), item.value());
  }
  const auto weights = saved_and_read(wrapped, "gpt_ddp_compiled.pt");
  EXPECT_EQ(weights.layout, GPTLayout::kNanoGPT);
  expect_loads_as(source, weights);
}

// A file missing a block, or one tensor of a block, is refused naming what
// is missing: it read as a shallower model (the blocks counted up to the
// first gap), whose load then blamed the blocks after it.
TEST(GptWeights, BlocksWithMissingTensorsAreRefused) {
  torch::manual_seed(8);
  GPT source(fixture_shape().layers(3));
  const auto whole = lamp::models::gpt_state_dict(*source, GPTLayout::kNanoGPT);
  const auto read_without =
      [&](const std::function<bool(const std::string&)>& dropped) {
        c10::Dict<std::string, torch::Tensor> dict;
        for (const auto& item : whole) {
          if (!dropped(item.key())) {
            dict.insert(item.key(), item.value());
          }
        }
        const auto path = temp_path("gpt_incomplete.pt");
        lamp::save_pickle(dict, path);
        const auto error =
            error_of([&] { lamp::models::read_gpt_weights(path); });
        std::remove(path.c_str());
        return error;
      };
  auto error = read_without([](const std::string& key) {
    return key.rfind("transformer.h.1.", 0) == 0;
  });
  EXPECT_TRUE(contains(error,
                       "holds blocks h.0 to h.2 with tensors missing: "
                       "h.1."))
      << error;
  error = read_without([](const std::string& key) {
    return key == "transformer.h.2.mlp.c_fc.weight";
  });
  EXPECT_TRUE(contains(error, "tensors missing: h.2.mlp.c_fc.weight;"))
      << error;
  // The whole file reads, as three layers.
  EXPECT_TRUE(read_without([](const std::string&) { return false; }).empty());
}

// GPT-2's weights without "transformer." and the head (GPT2Model's state
// dict, Hugging Face's gpt2 pytorch_model.bin) read as Hugging Face's, their
// Conv1D weights transposed back: c_attn's shape tells them from lamp's.
TEST(GptWeights, Gpt2WeightsWithoutThePrefixReadAsHuggingFaces) {
  torch::manual_seed(8);
  GPT source(fixture_shape());
  perturb(source);
  c10::Dict<std::string, torch::Tensor> bare;
  const std::string prefix = "transformer.";
  for (const auto& item :
       lamp::models::gpt_state_dict(*source, GPTLayout::kHuggingFace)) {
    if (item.key().compare(0, prefix.size(), prefix) == 0) {
      bare.insert(item.key().substr(prefix.size()), item.value());
    }
  }
  ASSERT_TRUE(bare.contains("h.0.attn.c_attn.weight"));
  ASSERT_FALSE(bare.contains("lm_head.weight"));
  const auto weights = saved_and_read(bare, "gpt_gpt2_bare.pt");
  EXPECT_EQ(weights.layout, GPTLayout::kHuggingFace);
  expect_loads_as(source, weights);
}

// A model whose context is shorter than the file's takes wpe's first rows
// (nanoGPT's crop_block_size); a longer one is refused naming wpe.
TEST(GptWeights, AShorterContextTakesTheFirstPositions) {
  const auto weights =
      lamp::models::read_gpt_weights(fixture("nanogpt_state_dict.pt"));
  GPT shorter(fixture_shape().context(5));
  lamp::models::load_gpt_weights(*shorter, weights);
  EXPECT_TRUE(torch::equal(shorter->wpe->weight,
                           weights.state.at("wpe.weight").slice(0, 0, 5)));
  GPT longer(fixture_shape().context(9));
  const auto error =
      error_of([&] { lamp::models::load_gpt_weights(*longer, weights); });
  EXPECT_TRUE(contains(error, "wpe.weight [8, 8] there, [9, 8] here")) << error;
}

// What does not fit is refused naming the file, the tensors and the fix,
// and leaves the model as it was.
TEST(GptWeights, WhatDoesNotFitIsRefusedNamingTheTensors) {
  const auto path = fixture("nanogpt_state_dict.pt");
  const auto weights = lamp::models::read_gpt_weights(path);
  // Another width: the shapes, both of them.
  GPT wide(fixture_shape().width(12));
  const auto before = wide->wte->weight.clone();
  auto error =
      error_of([&] { lamp::models::load_gpt_weights(*wide, weights); });
  EXPECT_TRUE(contains(error, path)) << error;
  EXPECT_TRUE(contains(error, "nanogpt layout")) << error;
  EXPECT_TRUE(
      contains(error, "h.0.attn.c_attn.weight [24, 8] there, [36, 12] here"))
      << error;
  EXPECT_TRUE(torch::equal(wide->wte->weight, before));
  // Without biases: the file's are not in the model.
  GPT bias_free(fixture_shape().bias(false));
  error =
      error_of([&] { lamp::models::load_gpt_weights(*bias_free, weights); });
  EXPECT_TRUE(contains(error, "not in the model h.0.attn.c_attn.bias"))
      << error;
  EXPECT_TRUE(contains(error,
                       "saved with biases: build the model with "
                       "GPTOptions::bias(true)"))
      << error;
  // A nanoGPT file without biases into a model with them: missing.
  const auto ckpt = lamp::models::read_gpt_weights(fixture("nanogpt_ckpt.pt"));
  GPT with_bias(fixture_shape());
  error = error_of([&] { lamp::models::load_gpt_weights(*with_bias, ckpt); });
  EXPECT_TRUE(contains(error, "missing h.0.ln_1.bias, h.0.attn.c_attn.bias"))
      << error;
  EXPECT_TRUE(contains(error,
                       "without biases: build the model with "
                       "GPTOptions::bias(false)"))
      << error;
  // An RMSNorm model has no LayerNorm bias to take: unexpected.
  GPT rms(fixture_shape().norm(GPTNorm::kRMSNorm));
  error = error_of([&] { lamp::models::load_gpt_weights(*rms, weights); });
  EXPECT_TRUE(contains(error, "not in the model h.0.ln_1.bias")) << error;
  // Other heads than nanoGPT's ckpt.pt records (2): no tensor's shape
  // differs, so only the record tells; the model is left as it was.
  GPT one_head(fixture_shape().bias(false).heads(1));
  const auto kept = one_head->wte->weight.clone();
  error = error_of([&] { lamp::models::load_gpt_weights(*one_head, ckpt); });
  EXPECT_TRUE(contains(error,
                       "holds a GPT of 2 attention heads, the model "
                       "has 1; build it with GPTOptions::heads(2)"))
      << error;
  EXPECT_TRUE(torch::equal(one_head->wte->weight, kept));
}

// A state dict for nanoGPT or Hugging Face of a model they run otherwise
// (RMSNorm, the other GELU) loads there strictly and computes other
// outputs: the export says so. lamp's own layout, and models they run as
// lamp does, say nothing.
TEST(GptWeights, AnExportTheirGptRunsOtherwiseWarns) {
  struct Case {
    GPTOptions options;
    GPTLayout layout;
    std::string warning; // "" for none
  };
  const auto rms = fixture_shape().bias(false).norm(GPTNorm::kRMSNorm);
  const std::vector<Case> cases = {
      {rms, GPTLayout::kNanoGPT, "the model runs RMSNorm, where nanogpt's"},
      {rms, GPTLayout::kHuggingFace, "RMSNorm, where huggingface's"},
      {rms, GPTLayout::kLamp, ""},
      {fixture_shape().gelu(GPTGelu::kTanh), GPTLayout::kNanoGPT,
       "the tanh GELU, where nanoGPT's MLP runs the exact one"},
      {fixture_shape(), GPTLayout::kHuggingFace,
       "the exact GELU, where Hugging Face's GPT-2 runs the tanh one"},
      {fixture_shape(), GPTLayout::kNanoGPT, ""},
      {fixture_shape().gelu(GPTGelu::kTanh), GPTLayout::kHuggingFace, ""}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.options.name() + " as " +
                 lamp::models::gpt_layout_name(c.layout));
    GPT gpt(c.options);
    std::vector<std::string> warnings;
    {
      lamp::WarningSink sink(
          [&](const std::string& message) { warnings.push_back(message); });
      lamp::models::gpt_state_dict(*gpt, c.layout);
    }
    if (c.warning.empty()) {
      EXPECT_TRUE(warnings.empty()) << warnings.front();
    } else {
      ASSERT_EQ(warnings.size(), 1u);
      EXPECT_TRUE(contains(warnings[0], c.warning)) << warnings[0];
    }
  }
}

// A file holding one name twice once the wrappers' prefixes are off (two
// models saved together) is refused: one of them was silently dropped.
TEST(GptWeights, ANameGivenTwiceIsRefused) {
  auto dict = lamp::load_pickle(fixture("nanogpt_state_dict.pt"), "test")
                  .toGenericDict();
  dict.insert("module.transformer.wte.weight",
              dict.at("transformer.wte.weight").toTensor() + 1);
  const auto path = temp_path("gpt_twice.pt");
  lamp::save_pickle(dict, path);
  const auto error = error_of([&] { lamp::models::read_gpt_weights(path); });
  EXPECT_TRUE(contains(error, "holds transformer.wte.weight twice")) << error;
  EXPECT_TRUE(contains(error, "module.transformer.wte.weight")) << error;
  std::remove(path.c_str());
}

// Files that are not one GPT's weights, each refused with what it is.
TEST(GptWeights, FilesThatAreNotAGptAreRefused) {
  // An untied head: lamp's GPT ties it.
  auto dict = lamp::load_pickle(fixture("nanogpt_state_dict.pt"), "test")
                  .toGenericDict();
  dict.insert_or_assign("lm_head.weight",
                        dict.at("lm_head.weight").toTensor() + 1);
  const auto untied = temp_path("gpt_untied.pt");
  lamp::save_pickle(dict, untied);
  auto error = error_of([&] { lamp::models::read_gpt_weights(untied); });
  EXPECT_TRUE(contains(error, untied + "'s lm_head.weight is not its "
                                       "transformer.wte.weight"))
      << error;
  // A tensor outside the GPT.
  dict.insert_or_assign("lm_head.weight",
                        dict.at("transformer.wte.weight").toTensor());
  dict.insert("value_head.weight", torch::zeros({1, 8}));
  const auto foreign = temp_path("gpt_foreign.pt");
  lamp::save_pickle(dict, foreign);
  error = error_of([&] { lamp::models::read_gpt_weights(foreign); });
  EXPECT_TRUE(contains(error,
                       "outside a GPT's \"transformer.\" and "
                       "\"lm_head.weight\": value_head.weight"))
      << error;
  // Another model's state dict: no embeddings.
  const auto linear = temp_path("gpt_linear.pt");
  torch::nn::Linear layer(2, 3);
  lamp::models::export_state_dict(*layer, linear);
  error = error_of([&] { lamp::models::read_gpt_weights(linear); });
  EXPECT_TRUE(contains(error, "holds no GPT's embeddings")) << error;
  EXPECT_TRUE(contains(error, "its tensors are bias, weight")) << error;
  // Not a torch.save file at all.
  const auto text = temp_path("gpt_text.pt");
  std::ofstream(text) << "not a model";
  error = error_of([&] { lamp::models::read_gpt_weights(text); });
  EXPECT_TRUE(contains(error, "is not a file written by Python's torch.save"))
      << error;
  for (const auto& path : {untied, foreign, linear, text}) {
    std::remove(path.c_str());
  }
}

// lamp::is_torch_save_file tells Python's files from lamp's checkpoints
// and from anything else, reading the zip's directory only.
TEST(GptWeights, TorchSaveFilesAreToldApart) {
  EXPECT_TRUE(lamp::is_torch_save_file(fixture("nanogpt_ckpt.pt")));
  GPT gpt(fixture_shape());
  const auto archive = temp_path("gpt_archive.pt");
  torch::save(gpt, archive);
  EXPECT_FALSE(lamp::is_torch_save_file(archive));
  EXPECT_FALSE(lamp::is_torch_save_file(temp_path("gpt_missing.pt")));
  std::remove(archive.c_str());
}

} // namespace
