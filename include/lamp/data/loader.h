#pragma once

/// \file
/// A device-resident data loader: the whole dataset lives on the training
/// device, batches are made by indexing there, augmentation runs there.

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "lamp/data/datasets.h"

namespace lamp {
namespace data {

/// Options of DeviceLoader.
struct LoaderOptions {
  /// Options with `batch_size` examples per batch and every other field at its
  /// default; implicit, so that a batch size converts to options.
  /* implicit */ LoaderOptions(int64_t batch_size = 128)
      : batch_size_(batch_size) {}
  /// Examples (images or sequences) per batch: at least 1, at most the samples an epoch serves
  /// (DeviceLoader::samples_per_epoch(), the dataset or its shard).
  TORCH_ARG(int64_t, batch_size);
  /// Reshuffle every epoch (from `seed` and the epoch number).
  TORCH_ARG(bool, shuffle) = true;
  /// Drop the last batch when it is smaller than batch_size.
  TORCH_ARG(bool, drop_last) = false;
  /// Seed of the shuffling and augmentation streams.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Random crop from the image zero-padded by this many pixels on each side
  /// (4 for CIFAR-10); 0 = no crop.
  TORCH_ARG(int64_t, crop_padding) = 0;
  /// Random horizontal flip with probability 1/2.
  TORCH_ARG(bool, horizontal_flip) = false;
  /// Per-channel mean and standard deviation, in [0, 1] pixel units; images
  /// become (x / 255 - mean) / std. Empty: just x / 255.
  TORCH_ARG(std::vector<double>, mean) = {};
  /// Per-channel standard deviation, in the same units; empty exactly when
  /// `mean` is, every value finite and positive.
  TORCH_ARG(std::vector<double>, std) = {};
  /// dtype of the produced images (kFloat, or kHalf/kBFloat16 to feed a
  /// converted network directly); or kLong, which token sequences [N, T]
  /// need (and images refuse): the token ids as int64 for an embedding
  /// (text windows, read_text_windows()), with no scaling, normalisation or
  /// augmentation (mean, std, crop_padding, horizontal_flip and
  /// channels_last must stay unset).
  TORCH_ARG(torch::Dtype, dtype) = torch::kFloat;
  /// Token windows at random offsets, as nanoGPT's `get_batch` draws them:
  /// each sequence of a batch starts at a position drawn uniformly from
  /// every one whose window and next token lie in the tokens the windows
  /// span (for n' windows of T tokens, 0 .. (n' - 1) T), not only at the
  /// multiples of T. The positions come from (seed, epoch, batch index,
  /// shard), so a batch is reproducible on its own and resuming needs no
  /// RNG state; an epoch serves as many batches as with fixed windows, but
  /// a token may be seen several times in one, or not at all. Needs token
  /// windows whose inputs and targets are views of one sequence, the
  /// targets one token on (text_windows(), read_token_files()), and
  /// `shuffle`; images refuse it.
  TORCH_ARG(bool, random_windows) = false;
  /// With random_windows: an epoch's batches rounded down to a multiple of
  /// this (where it has at least that many), so that gradient accumulation
  /// over this many batches (TrainerOptions' accumulation_steps) ends with
  /// the epoch on any data, as nanoGPT's iterations of
  /// gradient_accumulation_steps batches do; every batch draws its windows
  /// anyway, so no token is left out for good. 1 (the default) keeps the
  /// count; above 1 it is refused without random_windows, where the
  /// batches that would go are examples of their own.
  TORCH_ARG(int64_t, batches_multiple_of) = 1;
  /// Produce images in channels_last memory format.
  TORCH_ARG(bool, channels_last) = false;
  /// Data-parallel sharding (Python's DistributedSampler): every epoch's
  /// permutation is the same on all ranks (same seed), padded by repeating
  /// its first samples to a multiple of num_shards, and shard `shard` takes
  /// every num_shards-th sample from position `shard`. The shards of an
  /// epoch are disjoint (but for the padding), cover the dataset, and have
  /// the same size, so every rank runs the same number of steps.
  TORCH_ARG(int64_t, num_shards) = 1;
  /// This process's shard, 0 <= shard < num_shards: usually its rank.
  TORCH_ARG(int64_t, shard) = 0;
};

/// One batch, on the loader's device: inputs [B, C, H, W] images in the
/// loader's dtype, or int64 token ids [B, T]; targets int64 [B] (a class
/// per example) or [B, T] (a token per position).
struct Batch {
  /// Images [B, C, H, W], augmented, scaled, normalised and cast to
  /// LoaderOptions::dtype (channels_last when the options ask for it); or
  /// token ids [B, T], int64.
  torch::Tensor inputs;
  /// int64 [B], the class of each example; [B, T] the next token of each
  /// position of a sequence.
  torch::Tensor targets;
};

/// Serves batches of a Dataset from the training device.
///
/// The seed article lost most of FP16's gain on ResNet18 to its CPU data
/// loader; this one never touches the CPU per sample:
///  1. the uint8 images (or the token ids, in their own narrow type) and
///     the targets are copied to the device once;
///  2. each epoch's order is a permutation drawn from a generator seeded with
///     (seed, epoch), so an epoch is reproducible on its own (resuming needs
///     no RNG state);
///  3. a batch is an index_select on the device, then augmentation (random
///     crop with zero padding, horizontal flip: two gathers), scaling to
///     [0, 1], normalisation and the cast, all on the device.
///
/// Example:
/// \code
///   auto train = lamp::data::read_cifar10("data/cifar-10-batches-bin", true);
///   lamp::data::DeviceLoader loader(train, torch::kCUDA,
///       lamp::data::LoaderOptions(512).crop_padding(4).horizontal_flip(true)
///           .mean({0.4914, 0.4822, 0.4465}).std({0.2470, 0.2435, 0.2616}));
///   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
///     loader.set_epoch(epoch);
///     for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
///       auto batch = loader.batch(i);
///       // ... train on batch.inputs, batch.targets
///     }
///   }
/// \endcode
class DeviceLoader {
 public:
  /// Throws c10::Error on an empty or malformed dataset and on options that
  /// do not fit it: a batch_size above samples_per_epoch(), a bad shard,
  /// mean/std without one finite value per channel or a std that is not
  /// positive.
  DeviceLoader(const Dataset& data, const torch::Device& device,
               LoaderOptions options = {});

  /// Number of samples in the dataset.
  int64_t size() const { return targets_.size(0); }
  /// Samples this loader serves per epoch: size(), or its shard's size.
  int64_t samples_per_epoch() const;
  /// Batches per epoch: samples_per_epoch() / batch_size, rounded up, or
  /// down with drop_last.
  int64_t batches_per_epoch() const;
  /// The options the loader was made with.
  const LoaderOptions& options() const { return options_; }
  /// The whole dataset as the loader holds it, on device(), in the types it
  /// was given, before augmentation and normalisation (e.g. for
  /// data::fingerprint()).
  Dataset data() const { return {inputs_, targets_, unsigned_ids_}; }
  /// The device the batches are on, with its index ("cuda" given: "cuda:0"
  /// when that is the current device).
  const torch::Device& device() const { return device_; }

  /// Selects the epoch whose order and augmentation batch() serves.
  void set_epoch(int64_t epoch);
  /// The epoch batch() serves: 0 after construction, then the last
  /// set_epoch() argument.
  int64_t epoch() const { return epoch_; }
  /// This epoch's sample order (this shard's, int64, on the device);
  /// undefined with LoaderOptions::random_windows, which draws no order.
  const torch::Tensor& order() const { return order_; }

  /// Batch `index` (0 <= index < batches_per_epoch()) of the current epoch.
  /// The same (seed, epoch, index) always gives the same batch.
  Batch batch(int64_t index) const;

 private:
  torch::Tensor augment(const torch::Tensor& images, int64_t index) const;
  Batch random_windows(int64_t index, int64_t size) const;

  LoaderOptions options_;
  torch::Device device_;
  torch::Tensor inputs_;      // uint8 [N, C, H, W] or integers [N, T], device_
  torch::Tensor targets_;     // integers [N] or [N, T] on device_
  bool unsigned_ids_ = false; // Dataset::unsigned_ids
  // With random_windows: every window of the sequence the windows span
  // (inputs and targets, one token on), [starts, T] views on device_.
  torch::Tensor every_input_;
  torch::Tensor every_target_;
  torch::Tensor mean_; // [1, C, 1, 1] float on device_, or undefined
  torch::Tensor inv_std_;
  torch::Tensor order_;
  int64_t epoch_ = -1;
};

} // namespace data
} // namespace lamp
