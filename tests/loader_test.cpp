#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "lamp/data/loader.h"
#include "lamp/data/text.h"
#include "test_util.h"

namespace {

using lamp::data::DeviceLoader;
using lamp::data::LoaderOptions;
using lamp_test::BitEqual;

// n images whose pixels all equal their index (mod 256), labelled by index.
lamp::data::Dataset indexed(int64_t n, int64_t c = 1, int64_t h = 4,
                            int64_t w = 4) {
  auto labels = torch::arange(n);
  auto images = labels.remainder(256)
                    .to(torch::kByte)
                    .view({n, 1, 1, 1})
                    .expand({n, c, h, w})
                    .contiguous();
  return {images, labels};
}

torch::Tensor epoch_labels(const DeviceLoader& loader) {
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    parts.push_back(loader.batch(i).targets);
  }
  return torch::cat(parts);
}

TEST(DeviceLoader, ServesEveryIndexOncePerEpochInASeededOrder) {
  const auto data = indexed(103);
  DeviceLoader loader(data, torch::kCPU, LoaderOptions(10).seed(7));
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  const auto first = epoch_labels(loader);
  EXPECT_TRUE(BitEqual(std::get<0>(first.sort()), torch::arange(103)));
  EXPECT_FALSE(BitEqual(first, torch::arange(103))); // shuffled
  loader.set_epoch(1);
  const auto second = epoch_labels(loader);
  EXPECT_TRUE(BitEqual(std::get<0>(second.sort()), torch::arange(103)));
  EXPECT_FALSE(BitEqual(second, first)); // reshuffled per epoch
  // Same seed and epoch, same order, whatever happened before.
  DeviceLoader again(data, torch::kCPU, LoaderOptions(10).seed(7));
  again.set_epoch(5);
  again.set_epoch(1);
  EXPECT_TRUE(BitEqual(epoch_labels(again), second));
  DeviceLoader other_seed(data, torch::kCPU, LoaderOptions(10).seed(8));
  EXPECT_FALSE(BitEqual(epoch_labels(other_seed), first));
  // Images travel with their labels.
  const auto batch = loader.batch(3);
  EXPECT_TRUE(
      lamp_test::AllClose(batch.inputs.select(1, 0).select(1, 0).select(1, 0),
                          batch.targets.to(torch::kFloat) / 255.0f, 0, 1e-6));
}

TEST(DeviceLoader, DropLastAndNoShuffle) {
  DeviceLoader loader(indexed(103), torch::kCPU,
                      LoaderOptions(10).drop_last(true).shuffle(false));
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  EXPECT_TRUE(BitEqual(epoch_labels(loader), torch::arange(100)));
  EXPECT_THROW(loader.batch(10), c10::Error);
}

// Every augmented image must be a crop of the zero-padded original, mirrored
// or not: checked against all (dy, dx, flip) candidates.
TEST(DeviceLoader, CropAndFlipMovePixelsExactly) {
  const int64_t n = 16, h = 6, w = 5, pad = 2;
  auto images = torch::arange(n * 2 * h * w)
                    .remainder(251)
                    .add(1)
                    .to(torch::kByte)
                    .view({n, 2, h, w});
  const lamp::data::Dataset data{images, torch::arange(n)};
  DeviceLoader loader(
      data, torch::kCPU,
      LoaderOptions(8).crop_padding(pad).horizontal_flip(true).seed(3));
  int flipped = 0, shifted = 0;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const auto batch = loader.batch(b);
    ASSERT_EQ(batch.inputs.sizes(), torch::IntArrayRef({8, 2, h, w}));
    ASSERT_EQ(batch.inputs.scalar_type(), torch::kFloat);
    for (int64_t i = 0; i < 8; ++i) {
      const auto original = images[batch.targets[i].item<int64_t>()];
      const auto padded =
          torch::constant_pad_nd(original, {pad, pad, pad, pad}, 0);
      const auto got = (batch.inputs[i] * 255).round().to(torch::kByte);
      bool found = false;
      for (int64_t dy = 0; dy <= 2 * pad && !found; ++dy) {
        for (int64_t dx = 0; dx <= 2 * pad && !found; ++dx) {
          const auto crop = padded.slice(1, dy, dy + h).slice(2, dx, dx + w);
          if (torch::equal(got, crop)) {
            found = true;
            shifted += (dy != pad || dx != pad);
          } else if (torch::equal(got, crop.flip({2}))) {
            found = true;
            ++flipped;
            shifted += (dy != pad || dx != pad);
          }
        }
      }
      EXPECT_TRUE(found) << "batch " << b << " image " << i;
    }
  }
  EXPECT_GT(flipped, 0);
  EXPECT_GT(shifted, 0);
}

TEST(DeviceLoader, AugmentationIsReproducibleFromTheSeed) {
  torch::manual_seed(0);
  const lamp::data::Dataset data{
      torch::randint(0, 256, {40, 3, 32, 32}).to(torch::kByte),
      torch::arange(40)};
  const auto options =
      LoaderOptions(16).crop_padding(4).horizontal_flip(true).seed(11);
  DeviceLoader a(data, torch::kCPU, options), b(data, torch::kCPU, options);
  a.set_epoch(2);
  b.set_epoch(2);
  EXPECT_TRUE(BitEqual(a.batch(1).inputs, b.batch(1).inputs));
  b.set_epoch(3);
  EXPECT_FALSE(BitEqual(a.batch(1).inputs, b.batch(1).inputs));
}

// Each shard draws its own crops and flips: shard s of S takes batch i's
// from stream i * S + s, so a single shard augments as an unsharded loader
// does and two ranks never crop and flip alike.
TEST(DeviceLoader, EachShardDrawsItsOwnAugmentation) {
  // 32 copies of one asymmetric image: a batch shows its crops and flips.
  const auto image =
      torch::arange(1, 1 + 2 * 6 * 5).to(torch::kByte).view({1, 2, 6, 5});
  const lamp::data::Dataset data{image.expand({32, 2, 6, 5}).contiguous(),
                                 torch::zeros({32}, torch::kLong)};
  const auto options = LoaderOptions(8)
                           .shuffle(false)
                           .crop_padding(2)
                           .horizontal_flip(true)
                           .seed(7);
  const DeviceLoader one(data, torch::kCPU, options);
  const DeviceLoader first(data, torch::kCPU,
                           LoaderOptions(options).num_shards(2).shard(0));
  const DeviceLoader second(data, torch::kCPU,
                            LoaderOptions(options).num_shards(2).shard(1));
  ASSERT_EQ(first.batches_per_epoch(), 2);
  EXPECT_TRUE(BitEqual(first.batch(0).inputs, one.batch(0).inputs));
  EXPECT_TRUE(BitEqual(second.batch(0).inputs, one.batch(1).inputs));
  EXPECT_TRUE(BitEqual(first.batch(1).inputs, one.batch(2).inputs));
  EXPECT_TRUE(BitEqual(second.batch(1).inputs, one.batch(3).inputs));
  EXPECT_FALSE(BitEqual(first.batch(0).inputs, second.batch(0).inputs));
}

TEST(DeviceLoader, NormalisesCastsAndUsesChannelsLast) {
  auto images = torch::full({4, 2, 3, 3}, 51, torch::kByte); // 0.2 after /255
  const lamp::data::Dataset data{images, torch::zeros({4}, torch::kLong)};
  DeviceLoader loader(data, torch::kCPU,
                      LoaderOptions(4)
                          .shuffle(false)
                          .mean({0.1, 0.2})
                          .std({0.5, 0.25})
                          .dtype(torch::kBFloat16)
                          .channels_last(true));
  const auto batch = loader.batch(0);
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(batch.inputs.is_contiguous(torch::MemoryFormat::ChannelsLast));
  // (0.2 - 0.1) / 0.5 = 0.2 and (0.2 - 0.2) / 0.25 = 0, to BF16's resolution.
  EXPECT_NEAR(batch.inputs[0][0][1][1].item<float>(), 0.2f, 2e-3);
  EXPECT_NEAR(batch.inputs[0][1][1][1].item<float>(), 0.0f, 2e-3);
}

TEST(DeviceLoader, RejectsInconsistentOptions) {
  const auto data = indexed(10, 3);
  EXPECT_THROW(
      DeviceLoader(data, torch::kCPU, LoaderOptions(4).mean({0.5}).std({0.5})),
      c10::Error);
  EXPECT_THROW(DeviceLoader(data, torch::kCPU, LoaderOptions(0)), c10::Error);
  EXPECT_THROW(
      DeviceLoader(data, torch::kCPU, LoaderOptions(4).dtype(torch::kDouble)),
      c10::Error);
  EXPECT_THROW(
      DeviceLoader({data.inputs.to(torch::kFloat), data.targets}, torch::kCPU),
      c10::Error);
}

using lamp_test::error_of;

// A batch larger than an epoch would be one short batch (or, with
// drop_last, none); the limit is the shard's size when sharded.
TEST(DeviceLoader, RefusesABatchLargerThanAnEpoch) {
  const auto data = indexed(10);
  EXPECT_NE(
      error_of([&] {
        DeviceLoader(data, torch::kCPU, LoaderOptions(11));
      }).find("batch_size 11 is larger than the 10 samples an epoch serves (10 samples); use a batch_size of at most 10."),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              DeviceLoader(data, torch::kCPU,
                           LoaderOptions(std::numeric_limits<int64_t>::max()));
            }).find("is larger than the 10 samples"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              DeviceLoader(data, torch::kCPU,
                           LoaderOptions(5).drop_last(true).num_shards(3));
            }).find("the 4 samples an epoch serves (10 samples in 3 shards)"),
            std::string::npos);
  // The whole epoch in one batch is fine.
  EXPECT_EQ(
      DeviceLoader(data, torch::kCPU, LoaderOptions(10)).batches_per_epoch(),
      1);
  EXPECT_EQ(DeviceLoader(data, torch::kCPU,
                         LoaderOptions(4).drop_last(true).num_shards(3))
                .batches_per_epoch(),
            1);
}

// Constant images give a zero std; the message says which channel and why.
TEST(DeviceLoader, NamesTheChannelOfAZeroStd) {
  const auto what = error_of([] {
    DeviceLoader(indexed(10, 3), torch::kCPU,
                 LoaderOptions(4).mean({0.5, 0.5, 0.5}).std({0.2, 0.0, 0.2}));
  });
  EXPECT_NE(what.find("std[1] is 0"), std::string::npos) << what;
  EXPECT_NE(what.find("channel 1 of the images has the same value everywhere"),
            std::string::npos)
      << what;
  // A mean that is not finite made every image NaN, without a word.
  const auto nan_mean = error_of([] {
    DeviceLoader(
        indexed(10, 3), torch::kCPU,
        LoaderOptions(4).mean({0.5, std::nan(""), 0.5}).std({0.2, 0.2, 0.2}));
  });
  EXPECT_NE(nan_mean.find("mean[1] is nan; every mean must be finite"),
            std::string::npos)
      << nan_mean;
}

// --------------------------------------------------- random token windows

// 103 distinct ids (30000 + 997 k mod 40000), held as int16 and read as
// unsigned, as a uint16 token file of a vocabulary above 32,768 is: windows
// of 10 span 10 x 10 + 1 of them, so the starts are 0 .. 90.
struct Sequence {
  torch::Tensor ids; // int64 [103]
  lamp::data::Dataset windows;
};

Sequence wide_sequence() {
  const auto ids = (torch::arange(103) * 997 + 30000).remainder(40000);
  auto windows = lamp::data::text_windows(ids.to(torch::kShort), 10);
  windows.unsigned_ids = true;
  return {ids, windows};
}

// Where each row of `inputs` starts in `ids` (the ids are distinct), after
// checking that the row is the T ids from there and `targets` the next.
std::vector<int64_t> starts_of(const lamp::data::Batch& batch,
                               const torch::Tensor& ids) {
  std::vector<int64_t> starts;
  const int64_t t = batch.inputs.size(1);
  for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
    const auto at = ids.eq(batch.inputs[r][0]).nonzero();
    EXPECT_EQ(at.size(0), 1);
    const int64_t s = at.numel() == 1 ? at.item<int64_t>() : 0;
    EXPECT_LE(s + t + 1, ids.size(0)) << "start " << s;
    if (s + t + 1 <= ids.size(0)) {
      EXPECT_TRUE(BitEqual(batch.inputs[r], ids.slice(0, s, s + t)));
      EXPECT_TRUE(BitEqual(batch.targets[r], ids.slice(0, s + 1, s + t + 1)));
    }
    starts.push_back(s);
  }
  return starts;
}

TEST(DeviceLoader, RandomWindowsStartAnywhereTheirTokensAre) {
  const auto seq = wide_sequence();
  const auto options =
      LoaderOptions(4).dtype(torch::kLong).seed(3).random_windows(true);
  DeviceLoader loader(seq.windows, torch::kCPU, options);
  // As many batches as the fixed windows make: 10 in 4s.
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_FALSE(loader.order().defined());
  // 100 epochs draw 1,000 starts of 91: each is missed with probability
  // (90/91)^1000 < 2e-5, so every start is drawn (none beyond 90: the
  // checks of starts_of), not only the 10 multiples of 10.
  std::vector<int64_t> drawn(91, 0);
  for (int64_t epoch = 0; epoch < 100; ++epoch) {
    loader.set_epoch(epoch);
    for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
      const auto batch = loader.batch(i);
      EXPECT_EQ(batch.inputs.size(0), i < 2 ? 4 : 2);
      EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
      for (const int64_t s : starts_of(batch, seq.ids)) {
        drawn[std::min<int64_t>(s, 90)] += 1;
      }
    }
  }
  for (int64_t s = 0; s <= 90; ++s) {
    EXPECT_GT(drawn[s], 0) << "start " << s;
  }
  // A batch is (seed, epoch, index)'s, whatever came before.
  loader.set_epoch(2);
  const auto batch = loader.batch(1);
  DeviceLoader again(seq.windows, torch::kCPU, options);
  again.set_epoch(7);
  again.set_epoch(2);
  EXPECT_TRUE(BitEqual(again.batch(1).inputs, batch.inputs));
  again.set_epoch(3);
  EXPECT_FALSE(BitEqual(again.batch(1).inputs, batch.inputs));
  DeviceLoader other(seq.windows, torch::kCPU, LoaderOptions(options).seed(4));
  other.set_epoch(2);
  EXPECT_FALSE(BitEqual(other.batch(1).inputs, batch.inputs));
  // Each shard draws its own windows, as many batches as the others.
  DeviceLoader first(seq.windows, torch::kCPU,
                     LoaderOptions(options).num_shards(2).shard(0));
  DeviceLoader second(seq.windows, torch::kCPU,
                      LoaderOptions(options).num_shards(2).shard(1));
  EXPECT_EQ(first.batches_per_epoch(), 2);
  EXPECT_EQ(second.batches_per_epoch(), 2);
  EXPECT_FALSE(BitEqual(first.batch(0).inputs, second.batch(0).inputs));
  starts_of(first.batch(1), seq.ids);
  starts_of(second.batch(1), seq.ids);
}

// An epoch of random windows whole accumulation cycles: its batches rounded
// down to a multiple, each batch of its windows still full; fewer batches
// than the multiple, and fixed windows, left as they are.
TEST(DeviceLoader, RandomWindowsRoundAnEpochToWholeCycles) {
  const auto seq = wide_sequence(); // 10 windows
  const auto options =
      LoaderOptions(2).dtype(torch::kLong).seed(3).random_windows(true);
  const auto batches = [&](int64_t multiple, int64_t batch_size = 2,
                           bool drop_last = false) {
    return DeviceLoader(seq.windows, torch::kCPU,
                        LoaderOptions(options)
                            .batch_size(batch_size)
                            .drop_last(drop_last)
                            .batches_multiple_of(multiple))
        .batches_per_epoch();
  };
  EXPECT_EQ(batches(1), 5);
  EXPECT_EQ(batches(2), 4);
  EXPECT_EQ(batches(4), 4);
  EXPECT_EQ(batches(5), 5);
  EXPECT_EQ(batches(3, 3), 3);       // 4 batches of 3 (the last of 1)
  EXPECT_EQ(batches(3, 3, true), 3); // 3 whole ones
  EXPECT_EQ(batches(6), 5);          // fewer than one multiple: as they are
  DeviceLoader loader(seq.windows, torch::kCPU,
                      LoaderOptions(options).batches_multiple_of(4));
  loader.set_epoch(1);
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    EXPECT_EQ(loader.batch(i).inputs.size(0), 2);
    starts_of(loader.batch(i), seq.ids);
  }
  EXPECT_NE(error_of([&] {
              loader.batch(4);
            }).find("index 4 is outside this epoch's 4 batches"),
            std::string::npos);
  // The batches a multiple would drop of fixed windows are examples.
  const auto fixed = error_of([&] {
    DeviceLoader(seq.windows, torch::kCPU,
                 LoaderOptions(2).dtype(torch::kLong).batches_multiple_of(2));
  });
  EXPECT_NE(fixed.find("batches_multiple_of(2) rounds an epoch of "
                       "random_windows down"),
            std::string::npos)
      << fixed;
  EXPECT_NE(error_of([&] {
              DeviceLoader(seq.windows, torch::kCPU,
                           LoaderOptions(options).batches_multiple_of(0));
            }).find("batches_multiple_of must be at least 1, got 0"),
            std::string::npos);
}

TEST(DeviceLoader, RandomWindowsNeedOneSequenceOfTokens) {
  const auto seq = wide_sequence();
  const auto options =
      LoaderOptions(4).dtype(torch::kLong).random_windows(true);
  const auto not_one = [&](const lamp::data::Dataset& data) {
    return error_of([&] { DeviceLoader(data, torch::kCPU, options); });
  };
  const std::string fix =
      "not two views of one sequence, the targets one token on; cut the "
      "windows with data::text_windows() or read them with "
      "data::read_token_files(), or leave random_windows unset.";
  // Copies of the windows, the targets the inputs themselves, the targets
  // two tokens on.
  EXPECT_NE(not_one({seq.windows.inputs.clone(), seq.windows.targets.clone()})
                .find(fix),
            std::string::npos);
  EXPECT_NE(not_one({seq.windows.inputs, seq.windows.inputs}).find(fix),
            std::string::npos);
  const auto two_on =
      torch::empty({0}, torch::kShort)
          .set_(seq.windows.inputs.storage(), 2, {9, 10}, {10, 1});
  EXPECT_NE(not_one({seq.windows.inputs.slice(0, 0, 9), two_on}).find(fix),
            std::string::npos);
  const auto shuffled = error_of([&] {
    DeviceLoader(seq.windows, torch::kCPU,
                 LoaderOptions(options).shuffle(false));
  });
  EXPECT_NE(shuffled.find("random_windows draws every batch at random, and "
                          "shuffle(false) asks for the windows in order"),
            std::string::npos)
      << shuffled;
  const auto images = error_of([&] {
    DeviceLoader(indexed(10), torch::kCPU,
                 LoaderOptions(4).random_windows(true));
  });
  EXPECT_NE(images.find("leave it unset for images"), std::string::npos)
      << images;
}

TEST(DeviceLoader, GpuBatchesEqualCpuBatches_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const lamp::data::Dataset data{
      torch::randint(0, 256, {40, 3, 32, 32}).to(torch::kByte),
      torch::arange(40)};
  const auto options = LoaderOptions(16)
                           .crop_padding(4)
                           .horizontal_flip(true)
                           .mean({0.5, 0.5, 0.5})
                           .std({0.25, 0.25, 0.25});
  DeviceLoader cpu(data, torch::kCPU, options),
      gpu(data, torch::kCUDA, options);
  EXPECT_TRUE(gpu.batch(0).inputs.is_cuda());
  // torch::kCUDA resolved to the device with its index, as tensors name it.
  EXPECT_EQ(gpu.device(), gpu.batch(0).inputs.device());
  EXPECT_TRUE(gpu.device().has_index());
  EXPECT_TRUE(BitEqual(gpu.batch(0).inputs.cpu(), cpu.batch(0).inputs));
  EXPECT_TRUE(BitEqual(gpu.batch(0).targets.cpu(), cpu.batch(0).targets));
  // Token windows at random offsets: the same starts on either device.
  const auto seq = wide_sequence();
  const auto token_options =
      LoaderOptions(4).dtype(torch::kLong).seed(3).random_windows(true);
  DeviceLoader cpu_tokens(seq.windows, torch::kCPU, token_options),
      gpu_tokens(seq.windows, torch::kCUDA, token_options);
  cpu_tokens.set_epoch(2);
  gpu_tokens.set_epoch(2);
  const auto on_gpu = gpu_tokens.batch(1);
  EXPECT_TRUE(on_gpu.inputs.is_cuda());
  EXPECT_TRUE(BitEqual(on_gpu.inputs.cpu(), cpu_tokens.batch(1).inputs));
  EXPECT_TRUE(BitEqual(on_gpu.targets.cpu(), cpu_tokens.batch(1).targets));
}

} // namespace
