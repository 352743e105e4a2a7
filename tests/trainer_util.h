#pragma once

// A small Trainer run for the trainer's tests and the fault tests.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>

#include "lamp/training/trainer.h"
#include "test_util.h"

namespace lamp_test {

using lamp::training::Trainer;
using lamp::training::TrainerOptions;

// A small uint8 image problem the SmallNet can learn in a few epochs: the
// first 192 images train, the last 64 test (same labelling rule).
inline lamp::data::Dataset image_problem(bool train) {
  torch::manual_seed(1);
  const int64_t n = 256;
  auto offsets = torch::randn({n, 3, 1, 1});
  auto images = (128 + 40 * offsets + 20 * torch::randn({n, 3, 8, 8}))
                    .clamp(0, 255)
                    .to(torch::kByte);
  auto labels = offsets.flatten(1).mm(torch::randn({3, 4})).argmax(1);
  const int64_t start = train ? 0 : 192, end = train ? 192 : n;
  return {images.slice(0, start, end), labels.slice(0, start, end)};
}

struct Run {
  SmallNet model;
  std::unique_ptr<Trainer> trainer;
};

// `options` changed by `change`: nested options (step(), optimizer()) in one
// expression.
inline TrainerOptions with(TrainerOptions options,
                           const std::function<void(TrainerOptions&)>& change) {
  change(options);
  return options;
}

// How the programs name settings in messages: a key's flag ("batch_size" ->
// "--batch-size").
inline std::string flag_name(const std::string& key, const std::string&) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// The training loader's options of make_run().
inline lamp::data::LoaderOptions train_loader_options(int64_t batch_size) {
  return lamp::data::LoaderOptions(batch_size)
      .seed(9)
      .crop_padding(1)
      .horizontal_flip(true)
      .mean({0.5, 0.5, 0.5})
      .std({0.2, 0.2, 0.2});
}

// A trainer on image_problem() (or on `train` for its training data); its
// messages name settings as the programs do (flag_name) unless `options`
// names them itself.
inline std::unique_ptr<Run> make_run(
    lamp::Precision precision, TrainerOptions options, double lr = 0.05,
    int64_t batch_size = 32, torch::Device device = torch::kCPU,
    const lamp::data::Dataset& train = image_problem(true)) {
  auto run = std::make_unique<Run>();
  torch::manual_seed(5);
  run->model = SmallNet();
  run->model->to(device);
  auto model = run->model;
  const auto loader_options = train_loader_options(batch_size);
  run->trainer = std::make_unique<Trainer>(
      model.ptr(),
      [model](const torch::Tensor& x) mutable { return model->forward(x); },
      "smallnet", lamp::data::DeviceLoader(train, device, loader_options),
      lamp::data::DeviceLoader(image_problem(false), device,
                               lamp::data::LoaderOptions(64)
                                   .shuffle(false)
                                   .mean({0.5, 0.5, 0.5})
                                   .std({0.2, 0.2, 0.2})),
      with(options, [&](TrainerOptions& o) {
        o.step().precision(precision);
        o.optimizer().lr(lr);
        if (!o.option_name()) {
          o.option_name(flag_name);
        }
      }));
  return run;
}

// POSIX, not std::filesystem (see src/training/trainer.cpp;
// the pid keeps parallel test processes apart).
inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "lamp_training_test_" +
         std::to_string(::getpid()) + "_" + name;
}

inline bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

/// The bytes of a file ("" when it cannot be read).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace lamp_test
