#include "lamp/data/loader.h"

#include "lamp/data/tokens.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "data/split_mix.h"
#include "lamp/platform/out_of_memory.h"

namespace lamp {
namespace data {
namespace {

// Independent streams for the order and for each batch's augmentation, all
// derived from (seed, epoch[, batch]) with a 64-bit mix (SplitMix64's
// output), so nothing depends on how many numbers were drawn before.
uint64_t mix(uint64_t x) {
  return detail::split_mix64(x);
}

at::Generator generator_for(uint64_t seed, int64_t epoch, int64_t stream) {
  return at::make_generator<at::CPUGeneratorImpl>(
      mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^
          static_cast<uint64_t>(stream)));
}

// The stream of batch `index`'s random numbers (augmentation, or random
// windows' starts): each shard its own (the same as before for one).
at::Generator batch_stream(const LoaderOptions& options, int64_t epoch,
                           int64_t index) {
  return generator_for(options.seed(), epoch,
                       index * options.num_shards() + options.shard());
}

torch::Tensor channel_tensor(const std::vector<double>& values,
                             const torch::Device& device) {
  return torch::tensor(values, torch::kDouble)
      .to(torch::kFloat)
      .view({1, -1, 1, 1})
      .to(device);
}

// Samples per shard: the dataset padded to a multiple of the shard count
// (1 <= shards <= samples, checked before).
int64_t shard_size(int64_t samples, int64_t shards) {
  return samples / shards + (samples % shards != 0 ? 1 : 0);
}

} // namespace

DeviceLoader::DeviceLoader(const Dataset& data, const torch::Device& device,
                           LoaderOptions options)
    : options_(std::move(options)), device_(device) {
  const bool images = data.inputs.defined() && data.inputs.dim() == 4 &&
                      data.inputs.scalar_type() == torch::kByte;
  TORCH_CHECK(images || data.sequences(),
              "lamp::data::DeviceLoader: inputs must be uint8 images [N, C, "
              "H, W] or integer token ids [N, T], got ",
              (data.inputs.defined() ? data.inputs.sizes() : at::IntArrayRef{}),
              data.inputs.defined()
                  ? std::string(" ") + c10::toString(data.inputs.scalar_type())
                  : std::string(),
              ".");
  TORCH_CHECK(
      data.targets.defined() &&
          (data.targets.dim() == 1 || data.targets.dim() == 2) &&
          data.targets.size(0) == data.inputs.size(0) &&
          !data.targets.is_floating_point(),
      "lamp::data::DeviceLoader: need integer targets [N] (a class "
      "per example) or [N, T] (a token per position of a sequence) "
      "for the ",
      data.inputs.size(0), " examples, got ",
      (data.targets.defined() ? data.targets.sizes() : at::IntArrayRef{}), ".");
  TORCH_CHECK(data.inputs.size(0) > 0,
              "lamp::data::DeviceLoader: the dataset is empty.");
  TORCH_CHECK(options_.num_shards() >= 1 && options_.shard() >= 0 &&
                  options_.shard() < options_.num_shards(),
              "lamp::data::DeviceLoader: shard ", options_.shard(),
              " must be in [0, num_shards = ", options_.num_shards(), ").");
  TORCH_CHECK(options_.num_shards() <= data.targets.size(0),
              "lamp::data::DeviceLoader: ", options_.num_shards(),
              " shards of a dataset of ", data.targets.size(0),
              " samples would leave some empty.");
  TORCH_CHECK(options_.batch_size() > 0,
              "lamp::data::DeviceLoader: batch_size must be positive, got ",
              options_.batch_size(), ".");
  TORCH_CHECK(options_.crop_padding() >= 0,
              "lamp::data::DeviceLoader: crop_padding must be >= 0.");
  TORCH_CHECK(images || options_.dtype() == torch::kLong,
              "lamp::data::DeviceLoader: the inputs are token ids [N, T], "
              "which the loader serves as int64 for an embedding; set "
              "LoaderOptions::dtype(torch::kLong).");
  TORCH_CHECK(!images || options_.dtype() != torch::kLong,
              "lamp::data::DeviceLoader: dtype kLong serves token ids, but "
              "the inputs are images [N, C, H, W]; store token windows as "
              "[N, T] (data::text_windows()) or serve the images as kFloat, "
              "kHalf or kBFloat16.");
  TORCH_CHECK(options_.dtype() != torch::kLong ||
                  (options_.mean().empty() && options_.crop_padding() == 0 &&
                   !options_.horizontal_flip() && !options_.channels_last()),
              "lamp::data::DeviceLoader: dtype kLong serves token ids, which "
              "are not normalised, cropped, flipped or put in channels_last; "
              "leave mean, std, crop_padding, horizontal_flip and "
              "channels_last unset.");
  TORCH_CHECK(!options_.random_windows() || options_.dtype() == torch::kLong,
              "lamp::data::DeviceLoader: random_windows draws token windows "
              "at random offsets, but the inputs are images [N, C, H, W]; "
              "leave it unset for images (crop_padding and horizontal_flip "
              "augment them).");
  TORCH_CHECK(options_.batches_multiple_of() >= 1,
              "lamp::data::DeviceLoader: batches_multiple_of must be at "
              "least 1, got ",
              options_.batches_multiple_of(), ".");
  TORCH_CHECK(options_.batches_multiple_of() == 1 || options_.random_windows(),
              "lamp::data::DeviceLoader: batches_multiple_of(",
              options_.batches_multiple_of(),
              ") rounds an epoch of random_windows down; without them the "
              "batches it would drop are examples never served. Set "
              "random_windows, or pick a batch size whose batches per epoch "
              "are a multiple of it.");
  TORCH_CHECK(!options_.random_windows() || options_.shuffle(),
              "lamp::data::DeviceLoader: random_windows draws every batch at "
              "random, and shuffle(false) asks for the windows in order; "
              "leave shuffle set, or random_windows unset.");
  const int64_t channels = images ? data.inputs.size(1) : 0;
  TORCH_CHECK(
      options_.mean().size() == options_.std().size() &&
          (options_.mean().empty() ||
           static_cast<int64_t>(options_.mean().size()) == channels),
      "lamp::data::DeviceLoader: mean and std need one value per channel (",
      channels, "), got ", options_.mean().size(), " and ",
      options_.std().size(), ".");
  for (size_t c = 0; c < options_.mean().size(); ++c) {
    const double m = options_.mean()[c];
    TORCH_CHECK(std::isfinite(m), "lamp::data::DeviceLoader: mean[", c, "] is ",
                m, "; every mean must be finite (in [0, 1] pixel units).");
  }
  for (size_t c = 0; c < options_.std().size(); ++c) {
    const double s = options_.std()[c];
    TORCH_CHECK(
        std::isfinite(s) && s > 0, "lamp::data::DeviceLoader: std[", c, "] is ",
        s, "; every std must be finite and positive (a zero std means channel ",
        c, " of the images has the same value everywhere).");
  }
  TORCH_CHECK(
      options_.dtype() == torch::kFloat || options_.dtype() == torch::kHalf ||
          options_.dtype() == torch::kBFloat16 ||
          options_.dtype() == torch::kLong,
      "lamp::data::DeviceLoader: dtype must be kFloat, kHalf or kBFloat16 "
      "(images), or kLong (token ids), got ",
      options_.dtype(), ".");
  // A larger batch would be one short batch under another name (or, with
  // drop_last, none).
  const int64_t samples = data.targets.size(0);
  const int64_t per_epoch = shard_size(samples, options_.num_shards());
  TORCH_CHECK(options_.batch_size() <= per_epoch,
              "lamp::data::DeviceLoader: batch_size ", options_.batch_size(),
              " is larger than the ", per_epoch, " samples an epoch serves (",
              samples, " samples",
              options_.num_shards() > 1
                  ? " in " + std::to_string(options_.num_shards()) + " shards"
                  : std::string(),
              "); use a batch_size of at most ", per_epoch, ".");
  // Kept in their own (narrow) types on the device; a batch is widened.
  const auto& in = data.inputs;
  const auto& out = data.targets;
  const bool one_sequence = !images && in.is_contiguous() &&
                            out.is_contiguous() &&
                            in.scalar_type() == out.scalar_type() &&
                            in.storage().is_alias_of(out.storage());
  TORCH_CHECK(!options_.random_windows() ||
                  (one_sequence && out.sizes() == in.sizes() &&
                   out.storage_offset() == in.storage_offset() + 1),
              "lamp::data::DeviceLoader: random_windows draws windows at any "
              "offset of the sequence the token windows are cut from, but "
              "these inputs and targets are not two views of one sequence, "
              "the targets one token on; cut the windows with "
              "data::text_windows() or read them with "
              "data::read_token_files(), or leave random_windows unset.");
  if (one_sequence) {
    // Token windows whose targets are their inputs one id on (the views of
    // read_token_files()): one copy of the ids they span, both views of it.
    const int64_t lo = std::min(in.storage_offset(), out.storage_offset());
    const int64_t hi = std::max(in.storage_offset() + in.numel(),
                                out.storage_offset() + out.numel());
    const auto span = with_memory_context(
        "the dataset's tokens on " + device_.str(),
        static_cast<int64_t>((hi - lo) * in.element_size()),
        [&] { return in.as_strided({hi - lo}, {1}, lo).to(device_); });
    inputs_ =
        span.as_strided(in.sizes(), in.strides(), in.storage_offset() - lo);
    targets_ =
        span.as_strided(out.sizes(), out.strides(), out.storage_offset() - lo);
    device_ = inputs_.device();
    if (options_.random_windows()) {
      // Every window whose inputs and targets lie in the span: starts
      // 0 .. (N - 1) T of the inputs' first token (views, no copy).
      const int64_t first = in.storage_offset() - lo, tokens = in.numel();
      const int64_t length = in.size(1);
      every_input_ = span.slice(0, first, first + tokens).unfold(0, length, 1);
      every_target_ =
          span.slice(0, first + 1, first + tokens + 1).unfold(0, length, 1);
    }
  } else {
    inputs_ = with_memory_context(
        std::string("the dataset's ") + (images ? "images" : "tokens") +
            " on " + device_.str(),
        static_cast<int64_t>(data.inputs.nbytes()),
        [&] { return data.inputs.contiguous().to(device_); });
    // "cuda" as the tensors say it, "cuda:0": the trainer compares it with
    // the model's parameters' device.
    device_ = inputs_.device();
    targets_ = data.targets.contiguous().to(device_);
  }
  unsigned_ids_ = data.unsigned_ids;
  if (!options_.mean().empty()) {
    mean_ = channel_tensor(options_.mean(), device_);
    std::vector<double> inv;
    for (double s : options_.std()) {
      inv.push_back(1.0 / s);
    }
    inv_std_ = channel_tensor(inv, device_);
  }
  set_epoch(0);
}

int64_t DeviceLoader::samples_per_epoch() const {
  return shard_size(size(), options_.num_shards());
}

int64_t DeviceLoader::batches_per_epoch() const {
  const int64_t n = samples_per_epoch(), b = options_.batch_size();
  // Not (n + b - 1) / b, which overflows for b near INT64_MAX.
  const int64_t batches = n / b + (!options_.drop_last() && n % b != 0 ? 1 : 0);
  const int64_t multiple = options_.batches_multiple_of();
  return batches >= multiple ? batches / multiple * multiple : batches;
}

void DeviceLoader::set_epoch(int64_t epoch) {
  TORCH_CHECK(epoch >= 0,
              "lamp::data::DeviceLoader::set_epoch: epoch must be >= 0.");
  if (epoch == epoch_) {
    return;
  }
  epoch_ = epoch;
  if (options_.random_windows()) {
    return; // each batch draws its own windows (random_windows())
  }
  if (options_.shuffle()) {
    auto generator = generator_for(options_.seed(), epoch, /*stream=*/-1);
    order_ = torch::randperm(size(), generator, torch::kLong).to(device_);
  } else {
    order_ = torch::arange(
        size(), torch::TensorOptions().dtype(torch::kLong).device(device_));
  }
  const int64_t shards = options_.num_shards();
  if (shards > 1) {
    const int64_t padded = samples_per_epoch() * shards;
    if (padded > size()) {
      order_ = torch::cat({order_, order_.slice(0, 0, padded - size())});
    }
    order_ = order_.slice(0, options_.shard(), padded, shards);
  }
}

Batch DeviceLoader::batch(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < batches_per_epoch(),
              "lamp::data::DeviceLoader::batch: index ", index,
              " is outside this epoch's ", batches_per_epoch(), " batches.");
  const int64_t start = index * options_.batch_size();
  const int64_t end =
      std::min(start + options_.batch_size(), samples_per_epoch());
  if (options_.random_windows()) {
    return random_windows(index, end - start);
  }
  const auto idx = order_.slice(0, start, end);
  auto targets = widen_token_ids(targets_.index_select(0, idx), unsigned_ids_);
  if (options_.dtype() == torch::kLong) {
    return {widen_token_ids(inputs_.index_select(0, idx), unsigned_ids_),
            targets};
  }
  auto images = augment(inputs_.index_select(0, idx), index);
  auto x = images.to(torch::kFloat).mul_(1.0 / 255.0);
  if (mean_.defined()) {
    x.sub_(mean_).mul_(inv_std_);
  }
  x = x.to(options_.dtype());
  if (options_.channels_last()) {
    x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  }
  return {x, targets};
}

Batch DeviceLoader::random_windows(int64_t index, int64_t size) const {
  // The starts are drawn on the CPU, from the batch's own stream (each
  // shard its own, as augmentation's), so that a batch is the same on
  // every device; the tokens never leave the device. nanoGPT's get_batch
  // draws torch.randint(len(data) - block_size, ...): the same range.
  auto stream = batch_stream(options_, epoch_, index);
  const auto starts = torch::randint(0, every_input_.size(0), {size}, stream,
                                     torch::TensorOptions().dtype(torch::kLong))
                          .to(device_);
  const auto inputs = every_input_.index_select(0, starts);
  const auto targets = every_target_.index_select(0, starts);
  return {widen_token_ids(inputs, unsigned_ids_),
          widen_token_ids(targets, unsigned_ids_)};
}

torch::Tensor DeviceLoader::augment(const torch::Tensor& images,
                                    int64_t index) const {
  const int64_t pad = options_.crop_padding();
  if (pad == 0 && !options_.horizontal_flip()) {
    return images;
  }
  const int64_t b = images.size(0), c = images.size(1), h = images.size(2),
                w = images.size(3);
  // The random numbers are drawn on the CPU (a few per image) so that a
  // batch is the same on every device; the pixels never leave the device.
  auto generator = batch_stream(options_, epoch_, index);
  const auto long_cpu = torch::TensorOptions().dtype(torch::kLong);
  auto dy = torch::randint(0, 2 * pad + 1, {b}, generator, long_cpu);
  auto dx = torch::randint(0, 2 * pad + 1, {b}, generator, long_cpu);
  auto flip =
      options_.horizontal_flip()
          ? torch::randint(0, 2, {b}, generator, long_cpu).to(torch::kBool)
          : torch::zeros({b}, torch::kBool);
  dy = dy.to(device_);
  dx = dx.to(device_);
  flip = flip.to(device_);

  const auto padded =
      pad > 0 ? torch::constant_pad_nd(images, {pad, pad, pad, pad}, 0)
              : images;
  const auto on_device =
      torch::TensorOptions().dtype(torch::kLong).device(device_);
  const auto rows = dy.view({b, 1}) + torch::arange(h, on_device).view({1, h});
  const auto ascending = torch::arange(w, on_device).view({1, w});
  const auto cols =
      dx.view({b, 1}) +
      torch::where(flip.view({b, 1}), (w - 1) - ascending, ascending);
  const int64_t wp = padded.size(3);
  auto out = padded.gather(2, rows.view({b, 1, h, 1}).expand({b, c, h, wp}));
  return out.gather(3, cols.view({b, 1, 1, w}).expand({b, c, h, w}));
}

} // namespace data
} // namespace lamp
