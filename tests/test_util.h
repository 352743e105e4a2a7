#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lamp/platform/backends.h"
#include "lamp/platform/warnings.h"

namespace lamp_test {

/// NaN-aware closeness, with the failing values in the message.
inline ::testing::AssertionResult AllClose(const torch::Tensor& actual,
                                           const torch::Tensor& expected,
                                           double rtol, double atol) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " != " << expected.sizes();
  }
  const auto a = actual.to(torch::kDouble);
  const auto e = expected.to(torch::kDouble);
  if (torch::allclose(a, e, rtol, atol, /*equal_nan=*/true)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "max |actual - expected| = "
         << (a - e).abs().nan_to_num(0).max().item<double>() << " (rtol "
         << rtol << ", atol " << atol << ")";
}

/// Same dtype, same shape, same bits (NaN payloads aside).
inline ::testing::AssertionResult BitEqual(const torch::Tensor& actual,
                                           const torch::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type()
                                         << " != " << expected.scalar_type();
  }
  return AllClose(actual, expected, 0.0, 0.0);
}

/// A small ResNet-style conv net with BatchNorm, for conversion and training.
struct SmallNetImpl : torch::nn::Module {
  explicit SmallNetImpl(int64_t classes = 4)
      : conv1(torch::nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)),
        bn1(8),
        conv2(torch::nn::Conv2dOptions(8, 16, 3).stride(2).padding(1).bias(
            false)),
        bn2(16),
        fc(16, classes) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc", fc);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = torch::relu(bn2(conv2(y)));
    y = torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
    return fc(y);
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallNet);

/// A fixed synthetic classification problem: noisy images whose per-channel
/// offsets decide the label through a fixed random "teacher" projection.
struct Problem {
  torch::Tensor inputs;
  torch::Tensor targets;
};

inline Problem make_problem(int64_t n, int64_t classes, uint64_t seed) {
  torch::manual_seed(seed);
  auto offsets = torch::randn({n, 3, 1, 1});
  auto images = torch::randn({n, 3, 8, 8}) + 2 * offsets;
  auto teacher = torch::randn({3, classes});
  auto labels = offsets.flatten(1).mm(teacher).argmax(1);
  return {images, labels};
}

/// What `out` holds, read back: an archive as load() functions see it.
inline std::shared_ptr<torch::serialize::InputArchive> reopened(
    torch::serialize::OutputArchive& out) {
  std::stringstream stream;
  out.save_to(stream);
  auto in = std::make_shared<torch::serialize::InputArchive>();
  in->load_from(stream);
  return in;
}

/// `f` throws a c10::Error whose message contains `fragment`.
inline void expect_error(const std::function<void()>& f,
                         const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << e.what();
  }
}

/// The message of the c10::Error `body` throws ("" when it throws none).
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

/// The warnings raised on this thread while it lives (a lamp::WarningSink;
/// autograd's engine hands a backward's warnings to the thread that ran
/// it).
class Warnings {
 public:
  Warnings()
      : sink_([this](const std::string& message) {
          messages_.push_back(message);
        }) {}
  /// The messages that contain `fragment`, in order.
  std::vector<std::string> containing(const std::string& fragment) const {
    std::vector<std::string> found;
    for (const auto& message : messages_) {
      if (message.find(fragment) != std::string::npos) {
        found.push_back(message);
      }
    }
    return found;
  }

 private:
  std::vector<std::string> messages_;
  lamp::WarningSink sink_;
};

#define LAMP_SKIP_WITHOUT_CUDA()                     \
  do {                                               \
    if (!lamp::cuda_available()) {                   \
      GTEST_SKIP() << "no CUDA GPU in this process"; \
    }                                                \
  } while (0)

} // namespace lamp_test
