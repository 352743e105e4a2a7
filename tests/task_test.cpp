// The trainer's two tasks (classification, language model), token ids in
// the narrowest integer type, a vocabulary above 256 end to end, and the
// fingerprints that let lamp 0.4's checkpoints resume.
#include <gtest/gtest.h>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "test_util.h"

namespace {

using lamp::training::Task;
using lamp_test::BitEqual;
using lamp_test::error_of;
namespace F = torch::nn::functional;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ------------------------------------------------------------- the tasks

TEST(Task, ClassificationScoresAClassPerExample) {
  torch::manual_seed(1);
  const auto task = Task::classification();
  EXPECT_FALSE(task.is_language_model());
  EXPECT_EQ(task.example(), "image");
  EXPECT_EQ(task.prediction(), "image");
  EXPECT_EQ(task.accuracy_name(), "accuracy");
  EXPECT_EQ(Task::classification("review").example(), "review");
  const auto output = torch::randn({6, 4}, torch::kBFloat16);
  const auto targets = torch::tensor({0, 3, 1, 1, 2, 0}, torch::kLong);
  const auto loss = task.loss(output, targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_TRUE(
      BitEqual(loss, F::cross_entropy(output.to(torch::kFloat), targets)));
  EXPECT_NEAR(task.loss(output, targets, /*sum=*/true).item<double>(),
              6 * loss.item<double>(), 1e-5);
  // Ranked first: the argmax, counted where it is the target.
  const auto argmax = output.argmax(-1);
  const auto expected = argmax.eq(targets).sum().item<int64_t>();
  EXPECT_EQ(task.correct(output, targets).item<int64_t>(), expected);
  EXPECT_EQ(task.correct(output, argmax).item<int64_t>(), 6);
  // A language model's targets under classification: named, with the fix.
  const auto message = error_of([&] {
    task.loss(torch::randn({2, 3, 4}), torch::zeros({2, 3}, torch::kLong));
  });
  EXPECT_TRUE(has(message, "Task::language_model()")) << message;
}

TEST(Task, LanguageModelScoresEveryPositionInAnyIntegerType) {
  torch::manual_seed(2);
  const auto task = Task::language_model();
  EXPECT_TRUE(task.is_language_model());
  EXPECT_EQ(task.example(), "sequence");
  EXPECT_EQ(task.prediction(), "token");
  EXPECT_EQ(task.accuracy_name(), "next-token accuracy");
  const auto output = torch::randn({3, 5, 300});
  // Token ids above 255 in int16, as token_dtype(300) stores them.
  const auto targets = torch::randint(0, 300, {3, 5}, torch::kShort);
  const auto expected = F::cross_entropy(
      output.reshape({15, 300}), targets.reshape({15}).to(torch::kLong));
  EXPECT_TRUE(BitEqual(task.loss(output, targets), expected));
  EXPECT_NEAR(task.loss(output, targets, true).item<double>(),
              15 * expected.item<double>(), 1e-4);
  const auto argmax = output.argmax(-1);
  EXPECT_EQ(task.correct(output, argmax.to(torch::kShort)).item<int64_t>(), 15);
  EXPECT_EQ(task.correct(output, targets).item<int64_t>(),
            argmax.eq(targets.to(torch::kLong)).sum().item<int64_t>());
  const auto message = error_of([&] {
    task.loss(output.reshape({15, 300}), targets);
  });
  EXPECT_TRUE(has(message, "need the model's output [N, T, vocab]")) << message;
}

TEST(Task, ChecksTheDataFitsIt) {
  const lamp::data::Dataset images{torch::zeros({4, 1, 2, 2}, torch::kByte),
                                   torch::zeros({4}, torch::kLong)};
  const auto tokens = lamp::data::text_windows(
      torch::arange(40, torch::kLong).remainder(7).to(torch::kByte), 4);
  EXPECT_EQ(Task::classification().predictions_per_example(images), 1);
  EXPECT_EQ(Task::language_model().predictions_per_example(tokens), 4);
  Task::classification().check(images, "the training data");
  Task::language_model().check(tokens, "the training data");
  auto message = error_of(
      [&] { Task::classification().check(tokens, "the training data"); });
  EXPECT_TRUE(has(message, "the training data holds targets [9, 4]") &&
              has(message, "TrainerOptions::task(Task::language_model())"))
      << message;
  message =
      error_of([&] { Task::language_model().check(images, "the test data"); });
  EXPECT_TRUE(has(message, "a language model trains on token ids [N, T]") &&
              has(message, "the test data holds inputs [4, 1, 2, 2]"))
      << message;
  EXPECT_TRUE(has(error_of([] { Task::classification(""); }), "noun"));
}

TEST(Task, PerplexityIsExpOfTheLossAtAnySize) {
  EXPECT_DOUBLE_EQ(lamp::training::perplexity(0.0), 1.0);
  EXPECT_DOUBLE_EQ(lamp::training::perplexity(std::log(65.0)), 65.0);
  EXPECT_EQ(lamp::training::perplexity(1000.0),
            std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(lamp::training::perplexity(std::nan(""))));
}

// -------------------------------------------------------------- tokens

TEST(TokenDtype, IsTheNarrowestThatHoldsTheVocabulary) {
  EXPECT_EQ(lamp::data::token_dtype(1), torch::kByte);
  EXPECT_EQ(lamp::data::token_dtype(256), torch::kByte);
  EXPECT_EQ(lamp::data::token_dtype(257), torch::kShort);
  EXPECT_EQ(lamp::data::token_dtype(32768), torch::kShort);
  EXPECT_EQ(lamp::data::token_dtype(32769), torch::kInt);
  EXPECT_EQ(lamp::data::token_dtype(50257), torch::kInt);
  EXPECT_TRUE(has(error_of([] { lamp::data::token_dtype(0); }),
                  "between 1 and 2^31 - 1"));
  EXPECT_TRUE(has(error_of([] { lamp::data::token_dtype(int64_t{1} << 31); }),
                  "between 1 and 2^31 - 1"));
}

// A vocabulary of 1000 tokens, stored as int16: windows, loader, GPT and
// trainer carry ids above 255 unchanged, and a few steps learn a sequence
// that bytes could not hold.
TEST(TokenWindows, AVocabularyAbove256TrainsEndToEnd) {
  torch::manual_seed(5);
  const int64_t vocab = 1000;
  // A repeating walk through ids far above 255.
  const auto ids = (torch::arange(2000, torch::kLong) * 37 % 50 + 900)
                       .to(lamp::data::token_dtype(vocab));
  ASSERT_EQ(ids.scalar_type(), torch::kShort);
  const auto train = lamp::data::text_windows(ids.slice(0, 0, 1600), 8);
  const auto test = lamp::data::text_windows(ids.slice(0, 1600), 8);
  EXPECT_EQ(train.inputs.scalar_type(), torch::kShort);
  EXPECT_EQ(train.inputs[0][1].item<int64_t>(), ids[1].item<int64_t>());
  EXPECT_EQ(train.targets[0][7].item<int64_t>(), ids[8].item<int64_t>());
  lamp::data::DeviceLoader loader(
      train, torch::kCPU,
      lamp::data::LoaderOptions(20).shuffle(false).dtype(torch::kLong));
  const auto batch = loader.batch(0);
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(
      BitEqual(batch.inputs, train.inputs.slice(0, 0, 20).to(torch::kLong)));
  EXPECT_GE(batch.inputs.min().item<int64_t>(), 900);

  const auto shape = lamp::models::GPTOptions()
                         .layers(1)
                         .heads(2)
                         .width(32)
                         .context(8)
                         .vocab_size(vocab)
                         .dropout(0);
  lamp::models::GPT gpt(shape);
  auto options = lamp::training::TrainerOptions(lamp::Precision::kFP32)
                     .epochs(4)
                     .schedule(lamp::training::Schedule::kConstant)
                     .task(Task::language_model());
  options.optimizer().name("adamw").lr(1e-2);
  lamp::training::Trainer trainer(
      gpt.ptr(),
      [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); },
      shape.name(), std::move(loader),
      lamp::data::DeviceLoader(
          test, torch::kCPU,
          lamp::data::LoaderOptions(49).shuffle(false).dtype(torch::kLong)),
      options);
  const auto stats = trainer.fit();
  // Untrained: ln(1000) = 6.91. The walk's next id is a function of the
  // current one (50 states), which 40 steps learn well.
  EXPECT_LT(stats.back().test_loss, 2.0) << "ln(1000) = 6.91 untrained";
  EXPECT_GT(stats.back().test_accuracy, 0.5);
  EXPECT_EQ(stats.back().test_examples, test.size());
  EXPECT_NEAR(stats.back().tokens_per_second,
              8 * stats.back().examples_per_second,
              1e-9 * stats.back().tokens_per_second);
}

// A language model's data under the default task (classification) is
// refused when the trainer is made, naming the option.
TEST(TokenWindows, TheTrainerRefusesThemUnderClassification) {
  const auto data = lamp::data::text_windows(
      torch::arange(100, torch::kLong).remainder(9).to(torch::kByte), 8);
  lamp::models::GPT gpt(
      lamp::models::GPTOptions().layers(1).heads(1).width(8).context(8));
  const auto message = error_of([&] {
    lamp::training::Trainer(
        gpt.ptr(),
        [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); },
        "gpt",
        lamp::data::DeviceLoader(
            data, torch::kCPU,
            lamp::data::LoaderOptions(4).dtype(torch::kLong)),
        lamp::data::DeviceLoader(
            data, torch::kCPU,
            lamp::data::LoaderOptions(4).dtype(torch::kLong)),
        lamp::training::TrainerOptions());
  });
  EXPECT_TRUE(has(message, "the training data holds targets [12, 8]") &&
              has(message, "Task::language_model()"))
      << message;
}

// ------------------------------------------------------ fingerprints

TEST(SequenceFingerprint, NamesTokensAndMatchesLamp04sForm) {
  const auto bytes = torch::arange(200, torch::kLong).remainder(97);
  const auto windows = lamp::data::text_windows(bytes.to(torch::kByte), 16);
  const auto text = lamp::data::fingerprint(windows);
  EXPECT_EQ(text.rfind("12 sequences of 16 tokens (uint8), targets crc32 ", 0),
            0u)
      << text;
  // lamp 0.4 stored the same windows as uint8 images [N, 1, 1, T] with
  // int64 labels; its fingerprint of them is what its checkpoints hold.
  const lamp::data::Dataset as_04{windows.inputs.view({12, 1, 1, 16}),
                                  windows.targets.to(torch::kLong)};
  const auto old = lamp::data::fingerprint(as_04);
  EXPECT_EQ(old.rfind("12 images 1x1x16, labels crc32 ", 0), 0u) << old;
  EXPECT_TRUE(lamp::data::fingerprints_match(old, text));
  EXPECT_TRUE(lamp::data::fingerprints_match(text, text));
  // Other bytes do not match, in either form.
  auto other = windows;
  other.targets = other.targets.clone();
  other.targets[3][3] = 1;
  EXPECT_FALSE(
      lamp::data::fingerprints_match(old, lamp::data::fingerprint(other)));
  // Wider tokens never had a 0.4 form.
  const auto wide = lamp::data::text_windows(bytes.to(torch::kShort), 16);
  const auto wide_text = lamp::data::fingerprint(wide);
  EXPECT_TRUE(has(wide_text, "(int16)")) << wide_text;
  EXPECT_FALSE(lamp::data::fingerprints_match(old, wide_text));
}

// ------------------------------------------------------------ MFU's peak

// The datasheets' dense peaks, by the names LibTorch gives the GPUs, for
// each precision mode; 0 where the table does not know the device.
TEST(PeakFlops, TheDatasheetsDensePeaksByDeviceAndPrecision) {
  using lamp::Precision;
  const std::string h100 = "NVIDIA H100 80GB HBM3";
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kAMPBF16), 989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kBF16), 989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kAMP), 989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kHalf), 989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kTF32), 494.7e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kFP32), 66.9e12);
  // FP8 against the BF16 peak (only the Linear products are FP8).
  EXPECT_DOUBLE_EQ(lamp::peak_flops(h100, Precision::kFP8), 989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops("NVIDIA H200", Precision::kAMPBF16),
                   989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops("NVIDIA H100 PCIe", Precision::kAMP),
                   756e12);
  EXPECT_DOUBLE_EQ(
      lamp::peak_flops("NVIDIA A100-SXM4-80GB", Precision::kAMPBF16), 312e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops("NVIDIA A100-SXM4-80GB", Precision::kTF32),
                   156e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops("NVIDIA A100-SXM4-80GB", Precision::kFP32),
                   19.5e12);
  // Unknown: a CPU, another GPU, an unresolved mode.
  EXPECT_EQ(lamp::peak_flops("AMD EPYC", Precision::kFP32), 0.0);
  EXPECT_EQ(lamp::peak_flops("NVIDIA GeForce RTX 4090", Precision::kAMP), 0.0);
  EXPECT_EQ(lamp::peak_flops(h100, Precision::kAuto), 0.0);
}

// A model is a whole word of the name: the names other GPUs go by, which
// hold a table entry's name inside a longer word or add a board the table
// does not have, get 0, not that entry's peaks.
TEST(PeakFlops, MatchesModelsAsWholeWordsOfTheDeviceName) {
  using lamp::Precision;
  for (const char* a100 : {"NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB",
                           "NVIDIA A100 80GB PCIe"}) {
    EXPECT_DOUBLE_EQ(lamp::peak_flops(a100, Precision::kAMPBF16), 312e12)
        << a100;
  }
  EXPECT_DOUBLE_EQ(lamp::peak_flops("NVIDIA GH200 480GB", Precision::kBF16),
                   989.4e12);
  EXPECT_DOUBLE_EQ(lamp::peak_flops("NVIDIA H100 PCIe", Precision::kTF32),
                   378e12);
  for (const char* other :
       {"NVIDIA RTX A1000 6GB Laptop GPU", "NVIDIA RTX A1000", "NVIDIA A10",
        "NVIDIA H200 NVL", "NVIDIA H100 NVL",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb"}) {
    EXPECT_EQ(lamp::peak_flops(other, Precision::kAMPBF16), 0.0) << other;
  }
}

} // namespace
