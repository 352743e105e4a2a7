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

int64_t Dataset::size() const {
  return labels.defined() ? labels.size(0) : 0;
}

std::string fingerprint(const Dataset& dataset) {
  const auto& images = dataset.images;
  const auto& labels = dataset.labels;
  TORCH_CHECK(images.defined() && images.dim() == 4 &&
                  images.scalar_type() == torch::kUInt8 && labels.defined() &&
                  (labels.dim() == 1 || labels.dim() == 2) &&
                  labels.size(0) == images.size(0),
              "lamp::data::fingerprint: the dataset must hold uint8 images "
              "[N, C, H, W] and labels [N] or [N, T], got images ",
              images.defined() ? images.sizes() : c10::IntArrayRef{},
              " and labels ",
              labels.defined() ? labels.sizes() : c10::IntArrayRef{}, ".");
  const int64_t n = images.size(0);
  // About 1024 images: a few MB of CIFAR-10 instead of its 150 MB.
  constexpr int64_t kSampled = 1024;
  const int64_t every = std::max<int64_t>(1, (n + kSampled - 1) / kSampled);
  const auto sample =
      images
          .index_select(0, torch::arange(0, n, every,
                                         torch::TensorOptions()
                                             .dtype(torch::kLong)
                                             .device(images.device())))
          .cpu()
          .contiguous();
  const auto all_labels = labels.to(torch::kLong).cpu().contiguous();
  const auto crc_of = [](const torch::Tensor& t) {
    return lamp::crc32(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  };
  char text[160];
  std::snprintf(text, sizeof(text),
                "%lld images %lldx%lldx%lld, labels crc32 %08x, images crc32 "
                "%08x",
                static_cast<long long>(n),
                static_cast<long long>(images.size(1)),
                static_cast<long long>(images.size(2)),
                static_cast<long long>(images.size(3)),
                static_cast<unsigned>(crc_of(all_labels)),
                static_cast<unsigned>(crc_of(sample)));
  return text;
}

TensorImageDataset::TensorImageDataset(lamp::data::Dataset data,
                                       std::vector<double> mean,
                                       std::vector<double> std)
    : data_(std::move(data)) {
  const char* caller = "lamp::data::TensorImageDataset";
  const auto& images = data_.images;
  const auto& labels = data_.labels;
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
      data_.images[i].to(torch::kFloat).div_(255).sub_(mean_).div_(std_);
  return {std::move(image), data_.labels[i]};
}

c10::optional<size_t> TensorImageDataset::size() const {
  return static_cast<size_t>(data_.size());
}

} // namespace data
} // namespace lamp
