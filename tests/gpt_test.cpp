// The GPT of train_gpt and what it trains on: text windows, the loader's
// token ids, the trainer's loss over sequences, the model, sampling.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>

#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::models::GPT;
using lamp::models::GPTOptions;
using lamp_test::error_of;
using lamp_test::temp_path;

GPTOptions tiny() {
  return GPTOptions().layers(2).heads(2).width(16).context(8).dropout(0);
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const auto path = temp_path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

torch::Tensor bytes_of(const std::string& text) {
  auto t = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), text.data(), text.size());
  return t;
}

// ------------------------------------------------------------ text data

TEST(TextWindows, EachWindowIsLabelledWithItsNextBytes) {
  const auto data = lamp::data::text_windows(bytes_of("abcdefghij"), 3);
  // (10 - 1) / 3 = 3 windows: abc|bcd, def|efg, ghi|hij, as token ids
  // [N, T] in the bytes' own type: one byte a token, no int64 copy.
  ASSERT_EQ(data.inputs.sizes(), (c10::IntArrayRef{3, 3}));
  ASSERT_EQ(data.targets.sizes(), (c10::IntArrayRef{3, 3}));
  EXPECT_EQ(data.inputs.scalar_type(), torch::kByte);
  EXPECT_EQ(data.targets.scalar_type(), torch::kByte);
  EXPECT_TRUE(data.sequences());
  const std::string text = "abcdefghij";
  for (int64_t k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(data.inputs[k][i].item<int64_t>(), text[k * 3 + i]);
      EXPECT_EQ(data.targets[k][i].item<int64_t>(), text[k * 3 + i + 1]);
    }
  }
  // Two views of one copy of the 3 x 3 + 1 bytes they span (not of the
  // whole text, which they would keep alive), the targets one byte on.
  EXPECT_TRUE(data.inputs.storage().is_alias_of(data.targets.storage()));
  EXPECT_EQ(data.targets.storage_offset(), data.inputs.storage_offset() + 1);
  EXPECT_EQ(data.inputs.storage().nbytes(), 10u);
  const auto text_tensor = bytes_of("abcdefghijklmnopqrstuvwxyz");
  const auto some = lamp::data::text_windows(text_tensor.slice(0, 0, 10), 3);
  EXPECT_FALSE(some.inputs.storage().is_alias_of(text_tensor.storage()));
  EXPECT_EQ(some.inputs.storage().nbytes(), 10u);
  // Exactly one window more with one byte more where it completes one.
  EXPECT_EQ(lamp::data::text_windows(bytes_of("abcdefghij"
                                              "k"),
                                     3)
                .size(),
            3);
  EXPECT_EQ(lamp::data::text_windows(bytes_of("abcdefghij"
                                              "kl"),
                                     3)
                .size(),
            3);
  EXPECT_EQ(lamp::data::text_windows(bytes_of("abcdefghij"
                                              "klm"),
                                     3)
                .size(),
            4);
  EXPECT_NE(error_of([] {
              lamp::data::text_windows(bytes_of("abc"), 3);
            }).find("it needs 4"),
            std::string::npos);
  // A context whose window (context + 1) overflowed int64: refused by its
  // range, as 0 is.
  for (const int64_t context : {int64_t{0}, (int64_t{1} << 40) + 1,
                                std::numeric_limits<int64_t>::max()}) {
    EXPECT_NE(
        error_of([&] { lamp::data::text_windows(bytes_of("abc"), context); })
            .find("context must be in 1 ... 2^40, got " +
                  std::to_string(context)),
        std::string::npos)
        << context;
  }
}

TEST(ReadTextWindows, SplitsTheFirstNinetyPercentForTraining) {
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text += static_cast<char>('a' + i % 26);
  }
  const auto path = write_file("split.txt", text);
  const auto data = lamp::data::read_text_windows(path, 4);
  EXPECT_EQ(data.bytes, 100);
  EXPECT_EQ(data.train_bytes, 90);
  EXPECT_EQ(data.validation_bytes, 10);
  EXPECT_EQ(data.train.size(), (90 - 1) / 4);
  EXPECT_EQ(data.validation.size(), (10 - 1) / 4);
  // The validation windows start at byte 90.
  EXPECT_EQ(data.validation.inputs[0][0].item<int64_t>(), text[90]);
  EXPECT_EQ(data.validation.targets[1][3].item<int64_t>(), text[90 + 8]);
  ::unlink(path.c_str());
}

TEST(ReadTextBytes, AFolderIsItsTextFilesInNameOrder) {
  const auto dir = temp_path("text_folder");
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/b") << "BB";
  std::ofstream(dir + "/a") << "AA";
  std::ofstream(dir + "/a.dat") << std::string("\0\1", 2);
  std::ofstream(dir + "/.hidden") << "HH";
  ::symlink("a", (dir + "/a.u8").c_str());
  ::mkdir((dir + "/sub").c_str(), 0755);
  const auto bytes = lamp::data::read_text_bytes(dir);
  EXPECT_EQ(
      std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()),
      "AABB");
  for (const char* name : {"/a", "/b", "/a.dat", "/.hidden", "/a.u8"}) {
    ::unlink((dir + name).c_str());
  }
  ::rmdir((dir + "/sub").c_str());
  ::rmdir(dir.c_str());
}

TEST(ReadTextBytes, RefusesWhatIsNotTextNamingTheFileAndTheFix) {
  const auto missing = temp_path("no_such_text.txt");
  EXPECT_NE(error_of([&] {
              lamp::data::read_text_bytes(missing);
            }).find("does not exist; give a text file"),
            std::string::npos);
  const auto empty = write_file("empty.txt", "");
  EXPECT_NE(
      error_of([&] { lamp::data::read_text_bytes(empty); }).find("is empty"),
      std::string::npos);
  const auto nul = write_file("nul.bin", std::string("ab\0cd", 5));
  const auto nul_error = error_of([&] { lamp::data::read_text_bytes(nul); });
  EXPECT_NE(nul_error.find("looks binary (a NUL byte at offset 2)"),
            std::string::npos)
      << nul_error;
  // 1 control byte in 10 is text (ANSI colour codes, say); 2 are not.
  const auto one = write_file("one_control.txt",
                              "\x1b"
                              "bcdefghij");
  EXPECT_EQ(lamp::data::read_text_bytes(one).numel(), 10);
  const auto two = write_file("two_controls.txt",
                              "\x1b\x01"
                              "cdefghij");
  EXPECT_NE(error_of([&] { lamp::data::read_text_bytes(two); })
                .find("2 of 10 bytes are control characters, the first at "
                      "offset 0"),
            std::string::npos);
  const auto short_text = write_file("short.txt", std::string(50, 'x'));
  const auto short_error =
      error_of([&] { lamp::data::read_text_windows(short_text, 8); });
  // 45 + 5 bytes: the validation part needs 9.
  EXPECT_NE(short_error.find("45 for training and 5 for validation"),
            std::string::npos)
      << short_error;
  EXPECT_NE(short_error.find("at least 90 bytes, or a shorter context"),
            std::string::npos)
      << short_error;
  // A fraction so near 0 that its part needs more bytes than int64 counts
  // (the validation part rounds to none): the message asks for another
  // fraction rather than a text of a size the count overflows.
  const auto tiny_error =
      error_of([&] { lamp::data::read_text_windows(short_text, 8, 1e-17); });
  EXPECT_NE(tiny_error.find("50 for training and 0 for validation"),
            std::string::npos)
      << tiny_error;
  EXPECT_NE(tiny_error.find("give a validation_fraction further from 0 and 1"),
            std::string::npos)
      << tiny_error;
  for (const auto& p : {empty, nul, one, two, short_text}) {
    ::unlink(p.c_str());
  }
}

// --------------------------------------------- the loader and the trainer

TEST(DeviceLoaderTokens, ServesTheStoredBytesAsInt64AndLabelsPerPosition) {
  const auto data = lamp::data::text_windows(bytes_of("0123456789abcdefg"), 4);
  lamp::data::DeviceLoader loader(
      data, torch::kCPU,
      lamp::data::LoaderOptions(2).shuffle(false).dtype(torch::kLong));
  const auto batch = loader.batch(1);
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(
      torch::equal(batch.inputs, data.inputs.slice(0, 2, 4).to(torch::kLong)));
  EXPECT_EQ(batch.targets.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(batch.targets,
                           data.targets.slice(0, 2, 4).to(torch::kLong)));
  EXPECT_NE(error_of([&] {
              lamp::data::DeviceLoader(data, torch::kCPU,
                                       lamp::data::LoaderOptions(2));
            }).find("set LoaderOptions::dtype(torch::kLong)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              lamp::data::DeviceLoader(data, torch::kCPU,
                                       lamp::data::LoaderOptions(2)
                                           .dtype(torch::kLong)
                                           .mean({0.5})
                                           .std({0.5}));
            }).find("token ids, which are not normalised"),
            std::string::npos);
}

TEST(ClassifierLoss, AveragesOverEveryPositionOfASequence) {
  torch::manual_seed(1);
  const auto output = torch::randn({3, 5, 7}, torch::kBFloat16);
  const auto labels = torch::randint(0, 7, {3, 5}, torch::kLong);
  const auto expected = torch::nn::functional::cross_entropy(
      output.to(torch::kFloat).reshape({15, 7}), labels.reshape({15}));
  const auto loss = lamp::training::classifier_loss(output, labels);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_TRUE(lamp_test::BitEqual(loss, expected));
  EXPECT_NEAR(
      lamp::training::classifier_loss(output, labels, true).item<double>(),
      15 * expected.item<double>(), 1e-4);
  const auto argmax = output.argmax(-1);
  EXPECT_EQ(lamp::training::classifier_correct(output, argmax).item<int64_t>(),
            15);
  EXPECT_NE(
      error_of([&] {
        lamp::training::classifier_loss(output.reshape({15, 7}), labels);
      }).find("need the model's output [N, T, vocab]; got targets [3, 5]"),
      std::string::npos);
}

// ------------------------------------------------------------- the model

TEST(GptModel, HasNanoGptsParameterNamesAndShapes) {
  GPT gpt(tiny().layers(1));
  std::set<std::string> names;
  for (const auto& p : gpt->named_parameters()) {
    names.insert(p.key());
  }
  const std::set<std::string> expected = {"wte.weight",
                                          "wpe.weight",
                                          "h.0.ln_1.weight",
                                          "h.0.ln_1.bias",
                                          "h.0.attn.c_attn.weight",
                                          "h.0.attn.c_attn.bias",
                                          "h.0.attn.c_proj.weight",
                                          "h.0.attn.c_proj.bias",
                                          "h.0.ln_2.weight",
                                          "h.0.ln_2.bias",
                                          "h.0.mlp.c_fc.weight",
                                          "h.0.mlp.c_fc.bias",
                                          "h.0.mlp.c_proj.weight",
                                          "h.0.mlp.c_proj.bias",
                                          "ln_f.weight",
                                          "ln_f.bias"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(gpt->named_parameters()["h.0.mlp.c_fc.weight"].sizes(),
            (c10::IntArrayRef{64, 16}));
  EXPECT_EQ(gpt->named_parameters()["wpe.weight"].sizes(),
            (c10::IntArrayRef{8, 16}));
  EXPECT_EQ(tiny().name(),
            "gpt(layers=2, heads=2, width=16, context=8, vocab=256)");
}

// The count the programs check against the memory before building a model:
// the built model's, for a few shapes (the output head shares wte); a
// count beyond int64_t is refused, not wrapped.
TEST(GptModel, ParameterCountIsTheBuiltModels) {
  for (const auto& options :
       {tiny(), tiny().layers(1), tiny().width(24).heads(3).context(5),
        tiny().vocab_size(1000)}) {
    GPT gpt(options);
    int64_t built = 0;
    for (const auto& p : gpt->parameters()) {
      built += p.numel();
    }
    EXPECT_EQ(lamp::models::gpt_parameter_count(options), built)
        << options.name();
  }
  // 2^20 layers of width 2^20: 12 * 2^60 parameters.
  const auto huge = tiny().layers(int64_t{1} << 20).width(int64_t{1} << 20);
  EXPECT_NE(lamp_test::error_of([&] {
              lamp::models::gpt_parameter_count(huge);
            }).find("parameters, more than an int64_t counts"),
            std::string::npos);
}

// A count whose terms overflow int64_t before their sum is checked is
// refused all the same (vocab_size and context near INT64_MAX); a model
// without blocks is counted whatever a block of its width would hold.
TEST(GptModel, ParameterCountRefusesEveryTermBeyondInt64) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto& options :
       {GPTOptions().vocab_size(kMax), GPTOptions().context(kMax - 1),
        GPTOptions().vocab_size(kMax).context(kMax)}) {
    EXPECT_NE(lamp_test::error_of([&] {
                lamp::models::gpt_parameter_count(options);
              }).find("parameters, more than an int64_t counts"),
              std::string::npos)
        << options.name();
  }
  EXPECT_THROW(lamp::models::gpt_parameter_count(GPTOptions().vocab_size(-1)),
               c10::Error);
  // No blocks, width 2^40: wte and wpe 2 * 2^40, ln_f's weight and bias.
  const int64_t wide = int64_t{1} << 40;
  EXPECT_EQ(lamp::models::gpt_parameter_count(
                GPTOptions().layers(0).width(wide).vocab_size(1).context(1)),
            4 * wide);
}

TEST(GptModel, InitialisesAsGpt2) {
  torch::manual_seed(0);
  GPT gpt(GPTOptions().layers(8).heads(4).width(128).context(64));
  const auto p = gpt->named_parameters();
  // Sample standard deviations, within 11 to 22 of their standard errors
  // (sd / sqrt(2n): 7.8e-5 for wte's 256 x 128, 1.4e-5 and 2.8e-5 for the
  // MLP's 512 x 128 and the attention's 128 x 128 projections), and far
  // closer than a wrong rule (0.02 for a projection, 4x).
  EXPECT_NEAR(p["wte.weight"].std().item<double>(), 0.02, 0.001);
  // Residual projections: 0.02 / sqrt(2 * 8) = 0.005.
  EXPECT_NEAR(p["h.3.mlp.c_proj.weight"].std().item<double>(), 0.005, 0.0003);
  EXPECT_NEAR(p["h.3.attn.c_proj.weight"].std().item<double>(), 0.005, 0.0003);
  EXPECT_EQ(p["h.3.attn.c_attn.bias"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(p["h.3.ln_1.weight"].min().item<double>(), 1.0);
}

TEST(GptModel, IsCausalAndTiesItsOutputToTheEmbedding) {
  torch::manual_seed(2);
  GPT gpt(tiny());
  gpt->eval();
  auto tokens = torch::randint(0, 256, {2, 8}, torch::kLong);
  const auto logits = gpt->forward(tokens);
  ASSERT_EQ(logits.sizes(), (c10::IntArrayRef{2, 8, 256}));
  // A change at position 5 changes nothing before it, and position 5.
  auto changed = tokens.clone();
  changed.index_put_({0, 5}, (tokens[0][5].item<int64_t>() + 1) % 256);
  const auto other = gpt->forward(changed);
  EXPECT_TRUE(torch::equal(other.slice(1, 0, 5), logits.slice(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(other[0][5], logits[0][5]));
  // Any integer type of token ids is the same sequence; lamp 0.4's
  // [B, 1, 1, T] windows are refused, saying what changed.
  EXPECT_TRUE(torch::equal(gpt->forward(tokens.to(torch::kShort)), logits));
  EXPECT_NE(error_of([&] {
              gpt->forward(tokens.view({2, 1, 1, 8}));
            }).find("lamp 0.5 stores token windows as [N, T]"),
            std::string::npos);
  // Tied: the output projection's gradient reaches every row of the
  // embedding, where the lookup of token 0 alone reaches row 0 only.
  gpt->train();
  torch::nn::functional::cross_entropy(
      gpt->forward(torch::zeros({1, 8}, torch::kLong)).flatten(0, 1),
      torch::full({8}, 3, torch::kLong))
      .backward();
  EXPECT_GT(gpt->wte->weight.grad()[5].abs().sum().item<double>(), 0.0);
}

// nanoGPT's forward written out from the parameters alone: token plus
// position embeddings, pre-norm blocks of causal attention (an explicit
// mask) and a GELU MLP, a final norm and the output projection tied to the
// token embedding; no dropout. The options' way: biases where the model has
// them, LayerNorm or RMSNorm (x / sqrt(mean(x^2) + 1e-5) * weight), the
// exact or the tanh GELU.
torch::Tensor reference_forward(GPT& gpt, const torch::Tensor& ids) {
  auto p = gpt->named_parameters();
  const auto& o = gpt->options();
  const int64_t b = ids.size(0), t = ids.size(1), c = o.width();
  const int64_t heads = o.heads(), d = c / heads;
  const auto bias = [&](const std::string& n) {
    const auto* found = p.find(n + ".bias");
    return found != nullptr ? *found : torch::Tensor();
  };
  const auto ln = [&](const torch::Tensor& x, const std::string& n) {
    if (o.norm() == lamp::models::GPTNorm::kRMSNorm) {
      return x * (x.pow(2).mean(-1, true) + 1e-5).rsqrt() * p[n + ".weight"];
    }
    return torch::layer_norm(x, {c}, p[n + ".weight"], bias(n), 1e-5);
  };
  const auto linear = [&](const torch::Tensor& x, const std::string& n) {
    return torch::linear(x, p[n + ".weight"], bias(n));
  };
  const auto gelu = [&](const torch::Tensor& x) {
    if (o.gelu() == lamp::models::GPTGelu::kTanh) {
      // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
      return 0.5 * x *
             (1 +
              torch::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
    }
    return torch::gelu(x);
  };
  auto x = p["wte.weight"].index_select(0, ids.reshape(-1)).view({b, t, c}) +
           p["wpe.weight"].slice(0, 0, t);
  const auto future = torch::ones({t, t}, torch::kBool).triu(1);
  for (int64_t l = 0; l < o.layers(); ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const auto qkv = linear(ln(x, h + "ln_1"), h + "attn.c_attn").split(c, 2);
    const auto split = [&](const torch::Tensor& y) {
      return y.reshape({b, t, heads, d}).transpose(1, 2);
    };
    auto scores = split(qkv[0]).matmul(split(qkv[1]).transpose(-2, -1)) /
                  std::sqrt(static_cast<double>(d));
    scores =
        scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    const auto y = scores.softmax(-1)
                       .matmul(split(qkv[2]))
                       .transpose(1, 2)
                       .reshape({b, t, c});
    x = x + linear(y, h + "attn.c_proj");
    x = x + linear(gelu(linear(ln(x, h + "ln_2"), h + "mlp.c_fc")),
                   h + "mlp.c_proj");
  }
  return torch::linear(ln(x, "ln_f"), p["wte.weight"]);
}

// Each of GPTOptions' switches builds what it says and computes it: no
// bias anywhere with bias(false) (LayerNorm's either), RMSNorm's weight
// alone, the tanh GELU; the parameter count is the closed form's, and the
// norms stay norms for network_to_half and the decay groups.
TEST(GptModel, EveryOptionComputesItsArithmetic) {
  using lamp::models::GPTGelu;
  using lamp::models::GPTNorm;
  for (const bool bias : {true, false}) {
    for (const auto norm : {GPTNorm::kLayerNorm, GPTNorm::kRMSNorm}) {
      for (const auto gelu : {GPTGelu::kExact, GPTGelu::kTanh}) {
        const auto options = tiny().bias(bias).norm(norm).gelu(gelu);
        SCOPED_TRACE(options.name());
        torch::manual_seed(23);
        GPT gpt(options);
        int64_t count = 0;
        bool any_bias = false;
        {
          torch::NoGradGuard no_grad;
          for (auto& item : gpt->named_parameters()) {
            count += item.value().numel();
            const auto& key = item.key();
            any_bias = any_bias || key.compare(key.size() - 5, 5, ".bias") == 0;
            // Every parameter away from its initial value, so that each
            // one shows in the output.
            item.value().add_(torch::randn_like(item.value()) * 0.2);
          }
        }
        EXPECT_EQ(count, lamp::models::gpt_parameter_count(options));
        // RMSNorm has no bias even where the Linears have one.
        EXPECT_EQ(gpt->named_parameters().contains("h.0.ln_1.bias"),
                  bias && norm == GPTNorm::kLayerNorm);
        EXPECT_EQ(any_bias, bias);
        const auto& block = *gpt->h[0]->as<lamp::models::GPTBlock>();
        EXPECT_TRUE(lamp::nn::is_norm(*block.ln_1.ptr()));
        EXPECT_TRUE(lamp::nn::is_norm(*gpt->ln_f.ptr()));
        EXPECT_EQ(block.ln_2.ptr()->as<lamp::nn::RMSNorm>() != nullptr,
                  norm == GPTNorm::kRMSNorm);
        gpt->eval();
        const auto ids = torch::randint(0, 256, {2, 8}, torch::kLong);
        torch::NoGradGuard no_grad;
        const auto logits = gpt->forward(ids);
        const auto expected = reference_forward(gpt, ids);
        // As EvalForwardIsNanoGptsArithmetic's.
        EXPECT_TRUE(lamp_test::AllClose(logits, expected, 1e-4, 1e-5))
            << (logits - expected).abs().max().item<double>();
      }
    }
  }
  EXPECT_EQ(tiny().name(),
            "gpt(layers=2, heads=2, width=16, context=8, vocab=256)");
  EXPECT_EQ(tiny()
                .bias(false)
                .norm(lamp::models::GPTNorm::kRMSNorm)
                .gelu(lamp::models::GPTGelu::kTanh)
                .name(),
            "gpt(layers=2, heads=2, width=16, context=8, vocab=256, "
            "bias=false, norm=rmsnorm, gelu=tanh)");
}

// A bias-free LayerNorm clone()d (a user's copy of one block's norm, for an
// EMA or a probe) is the same norm: no bias grown by LibTorch's LayerNorm
// reset(), the same weight in its own storage, the same output.
TEST(GptModel, ABiasFreeNormClonesWithoutABias) {
  torch::manual_seed(29);
  GPT gpt(tiny().bias(false));
  auto& norm = *gpt->ln_f.ptr();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : norm.parameters()) {
      p.add_(torch::randn_like(p) * 0.2);
    }
  }
  norm.eval();
  const auto copy = norm.clone();
  ASSERT_EQ(copy->named_parameters().size(), 1u);
  ASSERT_TRUE(copy->named_parameters().contains("weight"));
  EXPECT_FALSE(copy->is_training());
  const auto weight = copy->named_parameters()["weight"];
  EXPECT_TRUE(torch::equal(weight, norm.named_parameters()["weight"]));
  EXPECT_NE(weight.data_ptr(), norm.named_parameters()["weight"].data_ptr());
  EXPECT_TRUE(weight.requires_grad());
  const auto x = torch::randn({2, 16});
  auto* as_norm = copy->as<torch::nn::LayerNorm>();
  ASSERT_NE(as_norm, nullptr);
  EXPECT_FALSE(as_norm->bias.defined());
  EXPECT_TRUE(
      torch::equal(as_norm->forward(x), gpt->ln_f.forward<torch::Tensor>(x)));
}

// The model computes nanoGPT's function: in eval mode (dropout off, though
// the model has some) its logits are the reference's; a token's position
// matters (the same tokens in another order give other logits at the same
// place beyond the first).
TEST(GptModel, EvalForwardIsNanoGptsArithmetic) {
  torch::manual_seed(21);
  GPT gpt(tiny().dropout(0.3));
  {
    // LayerNorm's affine away from 1 and 0, so that using it matters.
    torch::NoGradGuard no_grad;
    for (auto& item : gpt->named_parameters()) {
      if (item.key().find("ln_") != std::string::npos) {
        item.value().add_(torch::randn_like(item.value()) * 0.2);
      }
    }
  }
  gpt->eval();
  const auto ids = torch::randint(0, 256, {3, 8}, torch::kLong);
  torch::NoGradGuard no_grad;
  const auto logits = gpt->forward(ids);
  const auto expected = reference_forward(gpt, ids);
  // FP32 sums of at most 64 products in another order. The logits of this
  // tiny model are about 0.1, so the bound is mostly the absolute 1e-5,
  // 100 to 1000 times FP32's rounding there; a missing mask or position
  // moves them by far more.
  EXPECT_TRUE(lamp_test::AllClose(logits, expected, 1e-4, 1e-5))
      << (logits - expected).abs().max().item<double>();
  // Position embeddings: one token repeated gives different logits at
  // each position.
  const auto same = gpt->forward(torch::full({1, 8}, 7, torch::kLong));
  EXPECT_FALSE(torch::allclose(same[0][0], same[0][1]));
  // The reference on a shorter context: positions 0..t-1 of wpe.
  const auto shorter = ids.narrow(1, 0, 5);
  EXPECT_TRUE(lamp_test::AllClose(gpt->forward(shorter),
                                  reference_forward(gpt, shorter), 1e-4, 1e-5));
}

// Dropout (embeddings, attention, projections) in training mode only:
// training forwards are random and differ from eval's; eval is repeatable;
// at dropout 0 training is eval.
TEST(GptModel, DropoutOnlyInTraining) {
  torch::manual_seed(22);
  GPT gpt(tiny().dropout(0.3));
  const auto ids = torch::randint(0, 256, {2, 8}, torch::kLong);
  torch::NoGradGuard no_grad;
  gpt->eval();
  const auto a = gpt->forward(ids);
  EXPECT_TRUE(torch::equal(gpt->forward(ids), a));
  gpt->train();
  const auto b = gpt->forward(ids);
  const auto c = gpt->forward(ids);
  EXPECT_FALSE(torch::allclose(b, a));
  EXPECT_FALSE(torch::allclose(b, c));
  // Dropout 0: training is the same function as eval.
  torch::manual_seed(22);
  GPT plain(tiny().dropout(0.0));
  plain->train();
  const auto d = plain->forward(ids);
  plain->eval();
  EXPECT_TRUE(lamp_test::AllClose(d, plain->forward(ids), 0, 0));
}

// The embedding's dropout alone: a model of no blocks is embeddings, ln_f
// and the tied head, so training-mode randomness there is the embeddings'.
TEST(GptModel, EmbeddingDropoutInTrainingOnly) {
  torch::manual_seed(23);
  GPT gpt(tiny().layers(1).dropout(0.5));
  const auto ids = torch::randint(0, 256, {2, 8}, torch::kLong);
  torch::NoGradGuard no_grad;
  // Blocks off: their output projections zero, so each block adds nothing
  // (dropout of zero is zero).
  for (auto& item : gpt->named_parameters()) {
    if (item.key().find("c_proj") != std::string::npos) {
      item.value().zero_();
    }
  }
  gpt->eval();
  const auto eval = gpt->forward(ids);
  EXPECT_TRUE(
      lamp_test::AllClose(eval, reference_forward(gpt, ids), 1e-4, 1e-5));
  gpt->train();
  EXPECT_FALSE(torch::allclose(gpt->forward(ids), eval));
}

// Each block drops its MLP's output in training: with the attention's
// projection zero (it adds nothing), the block's randomness is the MLP's
// dropout alone.
TEST(GptModel, BlocksDropTheirMlpOutputInTrainingOnly) {
  torch::manual_seed(24);
  lamp::models::GPTBlock block(tiny().dropout(0.5));
  torch::NoGradGuard no_grad;
  block->attn->c_proj->weight.zero_();
  block->attn->c_proj->bias.zero_();
  const auto x = torch::randn({2, 8, 16});
  block->eval();
  const auto eval = block->forward(x);
  EXPECT_TRUE(torch::equal(block->forward(x), eval));
  block->train();
  const auto a = block->forward(x);
  EXPECT_FALSE(torch::allclose(a, eval));
  EXPECT_FALSE(torch::allclose(a, block->forward(x)));
}

// The attention drops its weights and its output in training only. At
// dropout 0.5 about half of the training output is exactly zero (the
// output's dropout: eval's has no zero), and the kept elements are not
// twice eval's (what the output's dropout alone would give, up to FP32
// rounding): the attention weights were dropped too.
TEST(GptModel, AttentionDropsItsWeightsAndItsOutputInTrainingOnly) {
  torch::manual_seed(25);
  lamp::models::CausalSelfAttention attn(tiny().dropout(0.5));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 8, 16});
  attn->eval();
  const auto eval = attn->forward(x);
  EXPECT_TRUE(torch::equal(attn->forward(x), eval));
  ASSERT_EQ(eval.eq(0).sum().item<int64_t>(), 0);
  attn->train();
  const auto train = attn->forward(x);
  const auto kept = train.ne(0);
  // 256 elements dropped with probability 0.5: 128 expected, sd 8.
  const auto dropped = 256 - kept.sum().item<int64_t>();
  EXPECT_GT(dropped, 64);
  EXPECT_LT(dropped, 192);
  EXPECT_FALSE(lamp_test::AllClose(train.masked_select(kept),
                                   2 * eval.masked_select(kept), 1e-4, 1e-5));
}

TEST(GptModel, MakeGptsForwardRunsItsModule) {
  torch::manual_seed(5);
  const auto model = lamp::models::make_gpt(tiny());
  auto* gpt = model.module->as<lamp::models::GPTImpl>();
  ASSERT_NE(gpt, nullptr);
  EXPECT_EQ(gpt->options().name(), tiny().name());
  gpt->eval();
  const auto tokens = torch::randint(0, 256, {2, 8}, torch::kLong);
  EXPECT_TRUE(torch::equal(model.forward(tokens), gpt->forward(tokens)));
}

TEST(GptModel, RefusesShapesAndInputsItCannotRun) {
  EXPECT_NE(error_of([] {
              GPT(tiny().heads(3));
            }).find("3 heads do not divide the width 16"),
            std::string::npos);
  EXPECT_NE(error_of([] { GPT(tiny().dropout(1.0)); }).find("[0, 1)"),
            std::string::npos);
  GPT gpt(tiny());
  EXPECT_NE(error_of([&] {
              gpt->forward(torch::zeros({1, 9}, torch::kLong));
            }).find("9 tokens do not fit the context of 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              gpt->forward(torch::zeros({1, 4}));
            }).find("token ids must be integers"),
            std::string::npos);
  // Ids beyond the vocabulary (256) or below 0: named, not the embedding's
  // "index out of range in self".
  for (const int64_t bad : {256, -1}) {
    auto ids = torch::zeros({2, 4}, torch::kLong);
    ids[1][3] = bad;
    EXPECT_NE(
        error_of([&] {
          gpt->forward(ids);
        }).find("token ids must be in [0, 256), got " + std::to_string(bad)),
        std::string::npos)
        << bad;
  }
  // The KV cache with gradients on: refused before its buffers are written
  // (a backward through them failed on an in-place write).
  lamp::models::GPTKVCache cache(*gpt, 1);
  gpt->set_kv_cache(&cache);
  EXPECT_NE(error_of([&] {
              gpt->forward(torch::zeros({1, 4}, torch::kLong));
            }).find("the KV cache serves generation, without gradients"),
            std::string::npos);
  EXPECT_EQ(cache.length(), 0);
  gpt->set_kv_cache(nullptr);
}

// The attention and the block built alone refuse what the GPT refuses,
// naming themselves: no integer division by zero heads, no raw view error
// from heads that do not divide the width, no raw dropout error.
TEST(GptModel, BlocksBuiltAloneRefuseOptionsTheyCannotRun) {
  struct Case {
    GPTOptions options;
    const char* message;
  };
  for (const auto& c :
       {Case{tiny().heads(0), "heads and width must be at least 1, got 0"},
        Case{tiny().heads(3), "3 heads do not divide the width 16"},
        Case{tiny().dropout(1.5), "dropout must be in [0, 1), got 1.5"}}) {
    const auto attention =
        error_of([&] { lamp::models::CausalSelfAttention attn(c.options); });
    EXPECT_NE(
        attention.find(std::string("lamp::models::CausalSelfAttention: ") +
                       c.message),
        std::string::npos)
        << attention;
    const auto block =
        error_of([&] { lamp::models::GPTBlock built(c.options); });
    EXPECT_NE(block.find(std::string("lamp::models::GPTBlock: ") + c.message),
              std::string::npos)
        << block;
  }
}

TEST(GptModel, TrainingFlopsCountTheParametersAsNanoGptDoes) {
  const auto options = tiny().layers(3).width(32).context(16);
  GPT gpt(options);
  int64_t n = 0;
  for (const auto& p : gpt->named_parameters()) {
    n += p.key() == "wpe.weight" ? 0 : p.value().numel();
  }
  const double per_token = 6.0 * n + 12.0 * 3 * 16 * 32;
  EXPECT_DOUBLE_EQ(lamp::models::gpt_training_flops(options), 16 * per_token);
}

// A GPT trains through Trainer on text windows: its validation
// loss falls well below an untrained model's ln(256).
TEST(GptModel, TrainsOnTextWindowsThroughTheTrainer) {
  torch::manual_seed(4);
  std::string text;
  for (int i = 0; i < 120; ++i) {
    text += "the cat sat on the mat. ";
  }
  const auto path = write_file("cats.txt", text);
  const auto data = lamp::data::read_text_windows(path, 8);
  GPT gpt(tiny());
  auto options = lamp::training::TrainerOptions(lamp::Precision::kFP32)
                     .epochs(3)
                     .schedule(lamp::training::Schedule::kConstant)
                     .task(lamp::training::Task::language_model());
  options.optimizer().name("adamw").lr(1e-2).weight_decay(0.1);
  options.step().max_grad_norm(1.0);
  lamp::training::Trainer trainer(
      gpt.ptr(),
      [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); },
      tiny().name(),
      lamp::data::DeviceLoader(
          data.train, torch::kCPU,
          lamp::data::LoaderOptions(16).dtype(torch::kLong)),
      lamp::data::DeviceLoader(
          data.validation, torch::kCPU,
          lamp::data::LoaderOptions(35).shuffle(false).dtype(torch::kLong)),
      options);
  const auto stats = trainer.fit();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_LT(stats.back().test_loss, 1.5) << "ln(256) = 5.55 untrained";
  EXPECT_GT(stats.back().test_accuracy, 0.5);
  // The evaluation is per position: its loss is the mean over all of them.
  const auto windows = data.validation.size();
  EXPECT_EQ(stats.back().test_examples, windows);
  gpt->eval();
  torch::NoGradGuard no_grad;
  const auto logits = gpt->forward(data.validation.inputs.to(torch::kLong));
  const auto direct = lamp::training::classifier_loss(
      logits, data.validation.targets.to(torch::kLong));
  // The trainer's mean over batches of 35 windows against one mean over
  // all: FP32 sums of losses near 1 in another order, 1e-5.
  EXPECT_NEAR(stats.back().test_loss, direct.item<double>(), 1e-5);
  EXPECT_NEAR(stats.back().test_perplexity(), std::exp(direct.item<double>()),
              1e-4 * stats.back().test_perplexity());
  // The next-token accuracy is the share of positions whose argmax is the
  // next byte.
  const auto hits = logits.argmax(-1)
                        .eq(data.validation.targets.to(torch::kLong))
                        .sum()
                        .item<double>();
  EXPECT_NEAR(stats.back().test_accuracy,
              hits / static_cast<double>(data.validation.targets.numel()),
              1e-12);
  // Tokens per second: sequences per second times the context.
  EXPECT_NEAR(stats.back().tokens_per_second,
              8 * stats.back().examples_per_second,
              1e-9 * stats.back().tokens_per_second);
  const double accuracy =
      static_cast<double>(
          lamp::training::classifier_correct(logits, data.validation.targets)
              .item<int64_t>()) /
      static_cast<double>(data.validation.targets.numel());
  EXPECT_NEAR(stats.back().test_accuracy, accuracy, 1e-12);
  ::unlink(path.c_str());
}

TEST(GptModel, TheTrainerTrainsThroughTheFusedHeadLoss) {
  // TrainerOptions::training_loss with GPTImpl::loss's fused head: called
  // once per step, and the run ends where the unfused one does (FP32: the
  // losses and gradients agree to rounding, so do the weights after a
  // short run). Bytes at width 16: two chunks of 64 positions per batch.
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "the cat sat on the mat. ";
  }
  const auto path = write_file("fused_cats.txt", text);
  const auto data = lamp::data::read_text_windows(path, 8);
  ::unlink(path.c_str());
  const auto train = [&](bool fused, int64_t* calls) {
    torch::manual_seed(5);
    auto built = lamp::models::make_gpt(tiny().fused_head_loss(fused));
    auto options = lamp::training::TrainerOptions(lamp::Precision::kFP32)
                       .epochs(2)
                       .task(lamp::training::Task::language_model());
    options.optimizer().name("adamw").lr(1e-2);
    if (fused) {
      EXPECT_TRUE(built.loss != nullptr);
      options.training_loss([calls, loss = built.loss](const torch::Tensor& x,
                                                       const torch::Tensor& y) {
        ++*calls;
        return loss(x, y);
      });
    }
    lamp::training::Trainer trainer(
        built.module, built.forward, tiny().name(),
        lamp::data::DeviceLoader(
            data.train, torch::kCPU,
            lamp::data::LoaderOptions(16).dtype(torch::kLong)),
        lamp::data::DeviceLoader(
            data.validation, torch::kCPU,
            lamp::data::LoaderOptions(8).shuffle(false).dtype(torch::kLong)),
        options);
    const auto stats = trainer.fit();
    return std::make_pair(stats, built.module);
  };
  int64_t calls = 0;
  const auto unfused = train(false, nullptr);
  const auto fused = train(true, &calls);
  int64_t steps = 0;
  for (const auto& epoch : fused.first) {
    steps += epoch.steps;
  }
  EXPECT_EQ(calls, steps);
  EXPECT_GT(steps, 0);
  EXPECT_NEAR(fused.first.back().train_loss, unfused.first.back().train_loss,
              1e-4);
  EXPECT_NEAR(fused.first.back().test_loss, unfused.first.back().test_loss,
              1e-4);
  const auto want = unfused.second->named_parameters();
  for (const auto& p : fused.second->named_parameters()) {
    SCOPED_TRACE(p.key());
    EXPECT_TRUE(lamp_test::AllClose(p.value(), want[p.key()], 1e-3, 1e-4));
  }
}

// ------------------------------------------------------------- sampling

TEST(Generate, IsRepeatableBySeedAndGreedyAtTopKOne) {
  torch::manual_seed(3);
  GPT gpt(tiny().dropout(0.1));
  const auto forward = [&](const torch::Tensor& x) { return gpt->forward(x); };
  const auto prompt = torch::tensor({72, 105}, torch::kLong);
  const auto options = lamp::models::GenerateOptions().tokens(20).seed(9);
  const auto one = lamp::models::generate(*gpt, forward, prompt, 8, options);
  const auto two = lamp::models::generate(*gpt, forward, prompt, 8, options);
  const auto other =
      lamp::models::generate(*gpt, forward, prompt, 8,
                             lamp::models::GenerateOptions(options).seed(10));
  ASSERT_EQ(one.sizes(), (c10::IntArrayRef{22}));
  EXPECT_TRUE(torch::equal(one.slice(0, 0, 2), prompt));
  EXPECT_TRUE(torch::equal(one, two));
  EXPECT_FALSE(torch::equal(one, other));
  EXPECT_TRUE(gpt->is_training()) << "the mode is restored";
  // top_k 1 takes the most likely byte, over the last `context` tokens.
  const auto greedy = lamp::models::generate(
      *gpt, forward, prompt, 8,
      lamp::models::GenerateOptions().tokens(12).top_k(1));
  gpt->eval();
  torch::NoGradGuard no_grad;
  for (int64_t i = 2; i < 14; ++i) {
    const auto window = greedy.slice(0, std::max<int64_t>(0, i - 8), i);
    const auto expected =
        gpt->forward(window.unsqueeze(0)).select(1, -1).argmax(-1);
    EXPECT_EQ(greedy[i].item<int64_t>(), expected.item<int64_t>()) << i;
  }
  EXPECT_NE(error_of([&] {
              lamp::models::generate(
                  *gpt, forward, prompt, 8,
                  lamp::models::GenerateOptions().temperature(0));
            }).find("temperature must be finite and positive"),
            std::string::npos);
  // Prompt ids outside the vocabulary (256) and a context above the GPT's
  // (8) are refused before any forward, naming them.
  const auto refused = [&](const torch::Tensor& ids, int64_t context) {
    return error_of([&] {
      lamp::models::generate(*gpt, forward, ids, context,
                             lamp::models::GenerateOptions().tokens(10));
    });
  };
  EXPECT_NE(refused(torch::tensor({72, 256}, torch::kLong), 8)
                .find("the token id 256, outside the GPT's vocabulary of 256"),
            std::string::npos);
  EXPECT_NE(refused(torch::tensor({-1, 72}, torch::kLong), 8)
                .find("the token id -1; ids are >= 0"),
            std::string::npos);
  EXPECT_NE(refused(prompt, 16)
                .find("context 16 is longer than the GPT's context of 8"),
            std::string::npos);
}

// With a KV cache, the logits of tokens fed in pieces (a prompt, then one
// at a time, then several after cached ones) are the whole sequence's, at
// their positions; the cache counts them, and refuses to outgrow the
// context.
TEST(GptKvCache, PiecesGiveTheWholeSequencesLogits) {
  for (const bool bias : {true, false}) {
    torch::manual_seed(5);
    GPT gpt(tiny().bias(bias).norm(bias ? lamp::models::GPTNorm::kLayerNorm
                                        : lamp::models::GPTNorm::kRMSNorm));
    gpt->eval();
    torch::NoGradGuard no_grad;
    const auto ids = torch::randint(0, 256, {2, 8}, torch::kLong);
    const auto whole = gpt->forward(ids);
    lamp::models::GPTKVCache cache(*gpt, 2);
    gpt->set_kv_cache(&cache);
    std::vector<torch::Tensor> pieces;
    for (const auto& range : std::vector<std::pair<int64_t, int64_t>>{
             {0, 3}, {3, 4}, {4, 5}, {5, 8}}) {
      pieces.push_back(gpt->forward(ids.slice(1, range.first, range.second)));
      EXPECT_EQ(cache.length(), range.second);
    }
    const auto cached = torch::cat(pieces, 1);
    // The same products in other groupings (one row of queries against
    // the cached keys): FP32 rounding, within the absolute 1e-5 at logits
    // of about 0.1 (100 to 1000 times FP32's rounding there).
    EXPECT_TRUE(lamp_test::AllClose(cached, whole, 1e-4, 1e-5))
        << (cached - whole).abs().max().item<double>();
    const auto error = error_of([&] { gpt->forward(ids.slice(1, 0, 1)); });
    EXPECT_NE(error.find("1 tokens after the 8 of the KV cache do not fit "
                         "the context of 8"),
              std::string::npos)
        << error;
    cache.clear();
    EXPECT_TRUE(lamp_test::AllClose(gpt->forward(ids), whole, 1e-4, 1e-5));
    gpt->set_kv_cache(nullptr);
    EXPECT_TRUE(torch::equal(gpt->forward(ids), whole));
  }
}

// generate() with the cache draws the tokens it draws without, within the
// context, beyond it (each window then computed whole) and from a prompt
// longer than the context; the model's own cache is left as it was.
TEST(Generate, KvCacheGivesTheUncachedTokens) {
  torch::manual_seed(6);
  GPT gpt(tiny());
  const auto forward = [&](const torch::Tensor& x) { return gpt->forward(x); };
  for (const int64_t prompt_length : {3, 12}) {
    const auto prompt = torch::randint(0, 256, {prompt_length}, torch::kLong);
    const auto options =
        lamp::models::GenerateOptions().tokens(20).seed(4).top_k(50);
    const auto with = lamp::models::generate(*gpt, forward, prompt, 8, options);
    const auto without = lamp::models::generate(
        *gpt, forward, prompt, 8,
        lamp::models::GenerateOptions(options).kv_cache(false));
    EXPECT_TRUE(torch::equal(with, without)) << prompt_length;
    EXPECT_EQ(with.size(0), prompt_length + 20);
  }
  EXPECT_EQ(gpt->kv_cache(), nullptr);
}

// A cache the caller left set on the GPT holds other tokens: generate()
// runs without it (with its own cache, or none: cache off, or a context
// other than the model's) and sets it back unchanged, so the tokens are
// those drawn with no cache set, and the caller's cache continues its
// sequence afterwards.
TEST(Generate, SetsTheCallersKvCacheAsideAndBackUnchanged) {
  torch::manual_seed(7);
  GPT gpt(tiny());
  gpt->eval();
  const auto forward = [&](const torch::Tensor& x) { return gpt->forward(x); };
  const auto prompt = torch::randint(0, 256, {3}, torch::kLong);
  const auto ids = torch::randint(0, 256, {1, 6}, torch::kLong);
  torch::Tensor whole;
  {
    torch::NoGradGuard no_grad;
    whole = gpt->forward(ids);
  }
  lamp::models::GPTKVCache mine(*gpt);
  struct Case {
    bool kv_cache;
    int64_t context;
  };
  for (const auto& c : {Case{false, 8}, Case{true, 8}, Case{true, 6}}) {
    SCOPED_TRACE(std::to_string(c.kv_cache) + " " + std::to_string(c.context));
    const auto options =
        lamp::models::GenerateOptions().tokens(10).seed(4).kv_cache(c.kv_cache);
    const auto expected =
        lamp::models::generate(*gpt, forward, prompt, c.context, options);
    mine.clear();
    gpt->set_kv_cache(&mine);
    {
      torch::NoGradGuard no_grad;
      gpt->forward(ids.slice(1, 0, 5));
    }
    const auto got =
        lamp::models::generate(*gpt, forward, prompt, c.context, options);
    EXPECT_TRUE(torch::equal(got, expected));
    EXPECT_EQ(gpt->kv_cache(), &mine);
    EXPECT_EQ(mine.length(), 5);
    torch::NoGradGuard no_grad;
    const auto next = gpt->forward(ids.slice(1, 5, 6));
    // The cached forward's rounding, as in
    // GptKvCache.PiecesGiveTheWholeSequencesLogits.
    EXPECT_TRUE(lamp_test::AllClose(next, whole.slice(1, 5, 6), 1e-4, 1e-5));
    gpt->set_kv_cache(nullptr);
  }
}

// A temperature so small that the logits divided by it overflow samples the
// most likely token (top_k 1's tokens), not a NaN distribution; logits that
// are not finite are refused with what they are.
TEST(Generate, ATinyTemperatureSamplesTheMostLikelyToken) {
  torch::manual_seed(3);
  GPT gpt(tiny());
  const auto forward = [&](const torch::Tensor& x) { return gpt->forward(x); };
  const auto prompt = torch::tensor({72, 105}, torch::kLong);
  const auto greedy = lamp::models::generate(
      *gpt, forward, prompt, 8,
      lamp::models::GenerateOptions().tokens(8).top_k(1));
  for (const double temperature :
       {1e-300, std::numeric_limits<double>::denorm_min()}) {
    const auto cold = lamp::models::generate(
        *gpt, forward, prompt, 8,
        lamp::models::GenerateOptions().tokens(8).temperature(temperature));
    EXPECT_TRUE(torch::equal(cold, greedy)) << temperature;
  }
  torch::nn::Linear module(1, 1);
  const auto nan_forward = [](const torch::Tensor& x) {
    return torch::full({x.size(0), x.size(1), 4},
                       std::numeric_limits<float>::quiet_NaN());
  };
  const auto error = error_of([&] {
    lamp::models::generate(*module, nan_forward,
                           torch::zeros({1}, torch::kLong), 4);
  });
  EXPECT_NE(error.find("logits at the last position are not finite"),
            std::string::npos)
      << error;
}

// A model of fixed next-token probabilities 0.5, 0.3, 0.15, 0.05:
// top_p keeps the most likely tokens until their sum reaches it.
TEST(Generate, TopPKeepsTheMostLikelyTokensReachingIt) {
  torch::nn::Linear module(1, 1);
  const auto logits = torch::log(torch::tensor({0.5, 0.3, 0.15, 0.05}));
  const auto forward = [&](const torch::Tensor& x) {
    return logits.view({1, 1, 4}).expand({x.size(0), x.size(1), 4});
  };
  const auto drawn = [&](double top_p) {
    const auto tokens = lamp::models::generate(
        *module, forward, torch::zeros({1}, torch::kLong), 4,
        lamp::models::GenerateOptions().tokens(400).temperature(1).top_p(
            top_p));
    std::set<int64_t> seen;
    for (int64_t i = 1; i < tokens.size(0); ++i) {
      seen.insert(tokens[i].item<int64_t>());
    }
    return seen;
  };
  EXPECT_EQ(drawn(0.4), (std::set<int64_t>{0}));
  EXPECT_EQ(drawn(0.8), (std::set<int64_t>{0, 1}));
  EXPECT_EQ(drawn(0.81), (std::set<int64_t>{0, 1, 2}));
  // 400 draws of p = 0.05 miss token 3 with probability 0.95^400 < 1e-8.
  EXPECT_EQ(drawn(1.0), (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_NE(error_of([&] { drawn(0.0); }).find("top_p must be in (0, 1]"),
            std::string::npos);
}

// A model padded beyond its tokenizer: logits favouring the padded ids
// (2 and 3, never a target) most. vocab_size 2 samples ids 0 and 1 only,
// in their own proportions; a vocab_size of every id is the default's
// draws; one beyond the logits or the GPT's vocabulary is refused.
TEST(Generate, VocabSizeSamplesTheTokenizersIdsOnly) {
  torch::nn::Linear module(1, 1);
  const auto logits = torch::log(torch::tensor({0.1, 0.1, 0.4, 0.4}));
  const auto forward = [&](const torch::Tensor& x) {
    return logits.view({1, 1, 4}).expand({x.size(0), x.size(1), 4});
  };
  const auto draw = [&](const lamp::models::GenerateOptions& options) {
    return lamp::models::generate(*module, forward,
                                  torch::zeros({1}, torch::kLong), 4, options);
  };
  const auto options =
      lamp::models::GenerateOptions().tokens(400).temperature(1);
  const auto within =
      draw(lamp::models::GenerateOptions(options).vocab_size(2));
  std::set<int64_t> seen;
  for (int64_t i = 1; i < within.size(0); ++i) {
    seen.insert(within[i].item<int64_t>());
  }
  // 400 draws of p = 0.5 miss one of the two with probability 2^-399.
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1}));
  // Without it the padded ids take about 80% of the draws.
  const auto all = draw(options);
  EXPECT_GT(all.slice(0, 1).ge(2).sum().item<int64_t>(), 200);
  EXPECT_TRUE(torch::equal(
      draw(lamp::models::GenerateOptions(options).vocab_size(4)), all));
  // The greedy token of the tokenizer's ids, not the padded ones'.
  const auto greedy = draw(
      lamp::models::GenerateOptions(options).tokens(3).top_k(1).vocab_size(1));
  EXPECT_TRUE(torch::equal(greedy, torch::zeros({4}, torch::kLong)));
  EXPECT_NE(error_of([&] {
              draw(lamp::models::GenerateOptions(options).vocab_size(5));
            }).find("vocab_size 5 is more than the model's 4 logits"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              draw(lamp::models::GenerateOptions(options).vocab_size(-1));
            }).find("vocab_size must be >= 0"),
            std::string::npos);
  torch::manual_seed(3);
  GPT gpt(tiny());
  const auto gpt_forward = [&](const torch::Tensor& x) {
    return gpt->forward(x);
  };
  const auto refused = error_of([&] {
    lamp::models::generate(*gpt, gpt_forward, torch::tensor({1}, torch::kLong),
                           8,
                           lamp::models::GenerateOptions().vocab_size(
                               gpt->options().vocab_size() + 1));
  });
  EXPECT_NE(refused.find("is more than the GPT's vocabulary of " +
                         std::to_string(gpt->options().vocab_size())),
            std::string::npos)
      << refused;
}

} // namespace

namespace {

// The loss and every gradient of one training step of `gpt` on `ids`, from
// the generator seeded with `seed` (dropout's masks), under `autocast`
// (none: FP32); the backward after the autocast region, or, with
// `backward_inside`, in it (where autocast's cache of parameter casts is
// still alive).
std::vector<torch::Tensor> step_gradients(GPT& gpt, const torch::Tensor& ids,
                                          uint64_t seed,
                                          c10::optional<torch::Dtype> autocast,
                                          bool backward_inside = false) {
  gpt->train();
  gpt->zero_grad();
  torch::manual_seed(seed);
  std::unique_ptr<lamp::Autocast> guard;
  if (autocast) {
    guard = std::make_unique<lamp::Autocast>(torch::kCPU, *autocast);
  }
  const auto logits = gpt->forward(ids.slice(1, 0, -1));
  const auto loss = torch::nn::functional::cross_entropy(
      logits.flatten(0, 1).to(torch::kFloat), ids.slice(1, 1).flatten());
  if (!backward_inside) {
    guard.reset();
  }
  loss.backward();
  guard.reset();
  std::vector<torch::Tensor> out = {loss.detach().clone()};
  for (const auto& p : gpt->parameters()) {
    out.push_back(p.grad().clone());
  }
  // What the generator draws next: the same with and without the
  // recomputation (it restores the state it borrowed).
  out.push_back(torch::rand({4}));
  return out;
}

} // namespace

// Activation checkpointing recomputes each block in the backward under the
// same autocast state and from the same generator state: the loss, every
// gradient (dropout 0.3, so the masks must be drawn again the same) and the
// generator's next draws equal the uncheckpointed step's bit for bit, in
// FP32 and under BF16 autocast; the blocks' backward nodes are the
// recomputing ones.
TEST(ActivationCheckpointing, GradientsEqualTheUncheckpointedStepBitForBit) {
  torch::manual_seed(41);
  const auto options = tiny().layers(3).dropout(0.3);
  GPT plain(options);
  GPT recomputed(GPTOptions(options).activation_checkpointing(true));
  {
    torch::NoGradGuard no_grad;
    const auto from = plain->parameters();
    const auto to = recomputed->parameters();
    for (size_t i = 0; i < from.size(); ++i) {
      to[i].copy_(from[i]);
    }
  }
  EXPECT_EQ(recomputed->options().name(), plain->options().name());
  const auto ids = torch::randint(0, 256, {3, 9}, torch::kLong);
  for (const auto autocast : {c10::optional<torch::Dtype>(),
                              c10::optional<torch::Dtype>(torch::kBFloat16)}) {
    const auto a = step_gradients(plain, ids, 5, autocast);
    // Inside first: the update below follows a backward outside the region.
    // (The parts of the backward outside the blocks see the region's
    // autocast state: an uncheckpointed step with its backward there too is
    // the reference.)
    for (const bool inside : {true, false}) {
      const auto reference =
          inside ? step_gradients(plain, ids, 5, autocast, true) : a;
      const auto b = step_gradients(recomputed, ids, 5, autocast, inside);
      ASSERT_EQ(reference.size(), b.size());
      for (size_t i = 0; i < b.size(); ++i) {
        EXPECT_TRUE(lamp_test::BitEqual(b[i], reference[i]))
            << "tensor " << i
            << (autocast ? " under BF16 autocast" : " in FP32")
            << (inside ? ", the backward inside the autocast region" : "");
      }
    }
    // Another seed, other masks: the comparison can tell them apart.
    const auto c = step_gradients(plain, ids, 6, autocast);
    EXPECT_FALSE(torch::equal(c[0], a[0]));
    step_gradients(plain, ids, 5, autocast);
    step_gradients(recomputed, ids, 5, autocast);
    // An update, then a forward under autocast: the recomputation leaves
    // no 16-bit copy of a parameter behind (autocast's cache outlives a
    // backward that runs outside any guard), so both models see the new
    // weights.
    {
      torch::NoGradGuard no_grad;
      for (auto* model : {&plain, &recomputed}) {
        for (auto& p : (*model)->parameters()) {
          p.sub_(p.grad(), 0.5);
        }
      }
      lamp::Autocast guard(torch::kCPU, autocast.value_or(torch::kBFloat16),
                           /*enabled=*/autocast.has_value());
      plain->eval();
      recomputed->eval();
      EXPECT_TRUE(lamp_test::BitEqual(recomputed->forward(ids.slice(1, 0, -1)),
                                      plain->forward(ids.slice(1, 0, -1))))
          << (autocast ? "under BF16 autocast" : "in FP32");
    }
  }
  recomputed->train();
  const auto logits = recomputed->forward(ids.slice(1, 0, -1));
  std::set<std::string> nodes;
  std::vector<torch::autograd::Node*> stack = {logits.grad_fn().get()};
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (node == nullptr ||
        !nodes
             .insert(node->name() + "@" +
                     std::to_string(reinterpret_cast<uintptr_t>(node)))
             .second) {
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      stack.push_back(edge.function.get());
    }
  }
  int recomputing = 0;
  for (const auto& n : nodes) {
    recomputing += n.rfind("lamp::nn::ActivationCheckpointBackward", 0) == 0;
  }
  EXPECT_EQ(recomputing, 3);
  // Evaluation and no-grad forwards keep nothing to recompute.
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(recomputed->forward(ids.slice(1, 0, -1)).requires_grad());
}

// lamp::nn::activation_checkpoint on its own: the gradients of the input
// and of the parameters; a second backward and an input changed in place
// are refused naming the fix; without grad mode it is the body.
TEST(ActivationCheckpointing, TheFunctionsGradientsAndRefusals) {
  torch::manual_seed(8);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto x = torch::randn({2, 4}, torch::requires_grad());
  const auto body = [&w](const torch::Tensor& in) {
    return torch::tanh(in.matmul(w)).pow(2);
  };
  body(x).sum().backward();
  const auto gx = x.grad().clone(), gw = w.grad().clone();
  x.mutable_grad().zero_();
  w.mutable_grad().zero_();
  const auto y = lamp::nn::activation_checkpoint(body, x, {w});
  EXPECT_TRUE(lamp_test::BitEqual(y, body(x).detach()));
  y.sum().backward();
  EXPECT_TRUE(lamp_test::BitEqual(x.grad(), gx));
  EXPECT_TRUE(lamp_test::BitEqual(w.grad(), gw));

  const auto twice = lamp::nn::activation_checkpoint(body, x * 1, {w});
  const auto loss = twice.sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_NE(
      error_of([&] { loss.backward(); }).find("its backward ran a second time"),
      std::string::npos);

  auto input = (x * 1).detach().requires_grad_();
  auto moved = input * 1;
  const auto changed = lamp::nn::activation_checkpoint(body, moved, {w});
  moved.add_(1);
  EXPECT_NE(error_of([&] {
              changed.sum().backward();
            }).find("the input was changed in place after the forward"),
            std::string::npos);

  torch::NoGradGuard no_grad;
  const auto plain = lamp::nn::activation_checkpoint(body, x, {w});
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_TRUE(lamp_test::BitEqual(plain, body(x)));
}

TEST(ActivationCheckpointing, ATiedWeightListedTwiceGetsItsGradientOnce) {
  // A module's parameters() lists a weight registered under two names
  // twice; the checkpoint's gradient of it equals the plain backward's.
  torch::manual_seed(9);
  auto w = torch::randn({4, 4}, torch::requires_grad());
  const auto x = torch::randn({2, 4});
  const auto body = [&w](const torch::Tensor& in) {
    return torch::tanh(in.matmul(w)).matmul(w.t()).sum(1);
  };
  body(x).sum().backward();
  const auto plain = w.grad().clone();
  w.mutable_grad().reset();
  lamp::nn::activation_checkpoint(body, x, {w, w}).sum().backward();
  EXPECT_TRUE(lamp_test::BitEqual(w.grad(), plain));
}

TEST(ActivationCheckpointing, ABodyReturningItsInputLeavesTheInputAlone) {
  // An identity body hands back the input itself; the checkpoint's output
  // is a tensor of its own, and the input keeps its place in the graph.
  auto x = torch::randn({3}, torch::requires_grad());
  const auto y = lamp::nn::activation_checkpoint(
      [](const torch::Tensor& in) { return in; }, x, {});
  EXPECT_FALSE(y.is_same(x));
  EXPECT_TRUE(x.is_leaf());
  (y * 3).sum().backward();
  EXPECT_TRUE(lamp_test::BitEqual(x.grad(), torch::full({3}, 3.0f)));
}

TEST(ActivationCheckpointing, HigherOrderGradientsAreRefused) {
  // The recomputation differentiates a detached copy of the input: a
  // second derivative would miss the input's terms, so it is refused.
  torch::manual_seed(10);
  auto w = torch::randn({4}, torch::requires_grad());
  const auto x = torch::randn({4}, torch::requires_grad());
  const auto y = lamp::nn::activation_checkpoint(
      [&w](const torch::Tensor& in) { return torch::tanh(in * w); }, x, {w});
  const auto message = error_of([&] {
    torch::autograd::grad({y.sum()}, {w}, {}, /*retain_graph=*/true,
                          /*create_graph=*/true);
  });
  EXPECT_NE(message.find("lamp::nn::activation_checkpoint is differentiable "
                         "once"),
            std::string::npos)
      << message;
}
