#include "lamp/data/datasets.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "lamp/platform/checkpoint_file.h"

// The readers are in mnist_idx.cpp and cifar10.cpp, their file helpers in
// files.cpp.

namespace lamp {
namespace data {
namespace {

const char* token_type_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kByte:
      return "uint8";
    case torch::kChar:
      return "int8";
    case torch::kShort:
      return "int16";
    case torch::kInt:
      return "int32";
    default:
      return "int64";
  }
}

} // namespace

int64_t Dataset::size() const {
  return targets.defined() ? targets.size(0) : 0;
}

bool Dataset::sequences() const {
  return inputs.defined() && inputs.dim() == 2 && !inputs.is_floating_point() &&
         !inputs.is_complex() && inputs.scalar_type() != torch::kBool;
}

torch::Dtype token_dtype(int64_t vocab_size) {
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= 2147483647LL,
              "lamp::data::token_dtype: a vocabulary of ", vocab_size,
              " tokens; it must hold between 1 and 2^31 - 1.");
  if (vocab_size <= 256) {
    return torch::kByte;
  }
  return vocab_size <= 32768 ? torch::kShort : torch::kInt;
}

std::string fingerprint(const Dataset& dataset) {
  const auto& inputs = dataset.inputs;
  const auto& targets = dataset.targets;
  const bool images = inputs.defined() && inputs.dim() == 4 &&
                      inputs.scalar_type() == torch::kUInt8;
  TORCH_CHECK((images || dataset.sequences()) && targets.defined() &&
                  (targets.dim() == 1 || targets.dim() == 2) &&
                  targets.size(0) == inputs.size(0),
              "lamp::data::fingerprint: the dataset must hold uint8 images "
              "[N, C, H, W] or integer token ids [N, T], and targets [N] or "
              "[N, T], got inputs ",
              inputs.defined() ? inputs.sizes() : c10::IntArrayRef{},
              " and targets ",
              targets.defined() ? targets.sizes() : c10::IntArrayRef{}, ".");
  const int64_t n = inputs.size(0);
  // About 1024 examples: a few MB of CIFAR-10 instead of its 150 MB.
  constexpr int64_t kSampled = 1024;
  const int64_t every = std::max<int64_t>(1, (n + kSampled - 1) / kSampled);
  const auto sample =
      inputs
          .index_select(0, torch::arange(0, n, every,
                                         torch::TensorOptions()
                                             .dtype(torch::kLong)
                                             .device(inputs.device())))
          .cpu()
          .contiguous();
  // Every target, up to 2^26 of them (as int64, 512 MiB); beyond, those of
  // the sampled examples: a memory-mapped token file of billions of ids is
  // neither copied whole nor read whole at every start.
  constexpr int64_t kAllTargets = int64_t{1} << 26;
  const bool all = targets.numel() <= kAllTargets;
  const auto crc_targets =
      (all ? targets
           : targets.index_select(0,
                                  torch::arange(0, n, every,
                                                torch::TensorOptions()
                                                    .dtype(torch::kLong)
                                                    .device(targets.device()))))
          .to(torch::kLong)
          .cpu()
          .contiguous();
  const auto crc_of = [](const torch::Tensor& t) {
    return lamp::crc32(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  };
  const auto targets_crc = static_cast<unsigned>(crc_of(crc_targets));
  const auto inputs_crc = static_cast<unsigned>(crc_of(sample));
  char text[200];
  if (images) {
    std::snprintf(
        text, sizeof(text),
        "%lld images %lldx%lldx%lld, labels crc32 %08x, images "
        "crc32 %08x",
        static_cast<long long>(n), static_cast<long long>(inputs.size(1)),
        static_cast<long long>(inputs.size(2)),
        static_cast<long long>(inputs.size(3)), targets_crc, inputs_crc);
  } else {
    // The CRCs are those of lamp 0.4's byte windows, stored as images
    // [N, 1, 1, T] (legacy_sequence_fingerprint()).
    std::snprintf(text, sizeof(text),
                  "%lld sequences of %lld tokens (%s), targets %scrc32 %08x, "
                  "tokens crc32 %08x",
                  static_cast<long long>(n),
                  static_cast<long long>(inputs.size(1)),
                  dataset.unsigned_ids && inputs.scalar_type() == torch::kShort
                      ? "uint16"
                      : token_type_name(inputs.scalar_type()),
                  all ? "" : "sample ", targets_crc, inputs_crc);
  }
  return text;
}

namespace {

// "N sequences of T tokens (uint8), targets crc32 X, tokens crc32 Y" ->
// "N images 1x1xT, labels crc32 X, images crc32 Y": what lamp 0.4 wrote for
// the same bytes (its windows were uint8 images [N, 1, 1, T] with int64
// labels, whose CRCs these are); "" for any other fingerprint.
std::string legacy_sequence_fingerprint(const std::string& fingerprint) {
  long long n = 0, t = 0;
  unsigned targets = 0, tokens = 0;
  char type[16] = {0};
  if (std::sscanf(fingerprint.c_str(),
                  "%lld sequences of %lld tokens (%15[^)]), targets crc32 %x, "
                  "tokens crc32 %x",
                  &n, &t, type, &targets, &tokens) != 5 ||
      std::string(type) != "uint8") {
    return "";
  }
  char text[160];
  std::snprintf(text, sizeof(text),
                "%lld images 1x1x%lld, labels crc32 %08x, images crc32 %08x", n,
                t, targets, tokens);
  return text;
}

} // namespace

bool fingerprints_match(const std::string& stored, const std::string& current) {
  return stored == current ||
         (!stored.empty() && stored == legacy_sequence_fingerprint(current));
}

TensorImageDataset::TensorImageDataset(lamp::data::Dataset data,
                                       std::vector<double> mean,
                                       std::vector<double> std)
    : data_(std::move(data)) {
  const char* caller = "lamp::data::TensorImageDataset";
  const auto& images = data_.inputs;
  const auto& labels = data_.targets;
  TORCH_CHECK(
      images.defined() && labels.defined(), caller,
      ": the dataset's images or labels are undefined; pass what read_cifar10() or read_mnist() returns.");
  TORCH_CHECK(images.dim() == 4 && images.scalar_type() == torch::kUInt8,
              caller, ": images must be uint8 [N, C, H, W], got ",
              images.scalar_type(), " ", images.sizes(), ".");
  TORCH_CHECK(labels.dim() == 1 && labels.scalar_type() == torch::kLong, caller,
              ": labels must be int64 [N], got ", labels.scalar_type(), " ",
              labels.sizes(), "; convert them with .to(torch::kLong).");
  TORCH_CHECK(images.size(0) == labels.size(0), caller, ": ", images.size(0),
              " images but ", labels.size(0),
              " labels; the counts must match.");
  TORCH_CHECK(
      images.device().is_cpu() && labels.device().is_cpu(), caller,
      ": images and labels must be on the CPU (the DataLoader moves batches, not the dataset); got ",
      images.device(), " and ", labels.device(), ".");
  const int64_t channels = images.size(1);
  TORCH_CHECK(static_cast<int64_t>(mean.size()) == channels &&
                  static_cast<int64_t>(std.size()) == channels,
              caller, ": the images have ", channels,
              " channels, so mean and std need ", channels,
              " values each; got ", mean.size(), " and ", std.size(), ".");
  for (int64_t c = 0; c < channels; ++c) {
    TORCH_CHECK(std::isfinite(mean[c]), caller, ": mean[", c, "] is ", mean[c],
                "; it must be finite.");
    TORCH_CHECK(std::isfinite(std[c]) && std[c] > 0, caller, ": std[", c,
                "] is ", std[c], "; it must be finite and positive.");
  }
  mean_ = torch::from_blob(mean.data(), {channels, 1, 1}, torch::kDouble)
              .to(torch::kFloat);
  std_ = torch::from_blob(std.data(), {channels, 1, 1}, torch::kDouble)
             .to(torch::kFloat);
}

torch::data::Example<> TensorImageDataset::get(size_t index) {
  const int64_t n = data_.size();
  TORCH_CHECK(index < static_cast<size_t>(n),
              "lamp::data::TensorImageDataset::get: index ", index,
              " is out of range for a dataset of ", n, " examples.");
  const auto i = static_cast<int64_t>(index);
  auto image =
      data_.inputs[i].to(torch::kFloat).div_(255).sub_(mean_).div_(std_);
  return {std::move(image), data_.targets[i]};
}

c10::optional<size_t> TensorImageDataset::size() const {
  return static_cast<size_t>(data_.size());
}

} // namespace data
} // namespace lamp
