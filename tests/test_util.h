#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lamp/platform/backends.h"
#include "lamp/platform/warnings.h"

namespace lamp_test {

/// A fresh folder under the test's temporary folder for the running test
/// (`PREFIX_TEST_PID_NAME`), removed with everything in it at the end.
class ScratchFolder {
 public:
  ScratchFolder(const std::string& prefix, const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "/" + prefix + "_" + info->name() + "_" +
           std::to_string(::getpid()) + "_" + name;
    const std::string command =
        "rm -rf '" + dir_ + "' && mkdir -p '" + dir_ + "'";
    EXPECT_EQ(std::system(command.c_str()), 0);
  }
  ~ScratchFolder() {
    const std::string command = "rm -rf '" + dir_ + "'";
    (void)std::system(command.c_str());
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;

  /// Writes `text` to the file `name` in it (its folders made); its path.
  std::string write(const std::string& name, const std::string& text) const {
    const auto file = path(name);
    const std::string command =
        "mkdir -p '" + file.substr(0, file.rfind('/')) + "'";
    EXPECT_EQ(std::system(command.c_str()), 0);
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  /// The path of `name` in it.
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }
  /// The names in its folder `name`, sorted, hidden ones too (none where
  /// there is no such folder).
  std::vector<std::string> list(const std::string& name) const {
    std::vector<std::string> names;
    const std::string command = "ls -A '" + path(name) + "' 2>/dev/null";
    FILE* pipe = ::popen(command.c_str(), "r");
    char line[4096];
    while (pipe != nullptr && std::fgets(line, sizeof line, pipe) != nullptr) {
      std::string entry = line;
      if (!entry.empty() && entry.back() == '\n') {
        entry.pop_back();
      }
      names.push_back(entry);
    }
    if (pipe != nullptr) {
      ::pclose(pipe);
    }
    return names;
  }

 private:
  std::string dir_;
};

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

/// An optimizer `Base` whose load refuses after Base's has loaded, where
/// `fail` is set: an optimizer of one's own whose own check, made last,
/// fails after the load changed the state and (here) group 0's learning
/// rate. Throws "LoadFailsLast: its own check failed."
template <typename Base>
class LoadFailsLast : public Base {
 public:
  using Base::Base;
  bool fail = false;
  void load(torch::serialize::InputArchive& archive) override {
    Base::load(archive);
    if (fail) {
      this->param_groups()[0].options().set_lr(12.5);
      TORCH_CHECK(false, "LoadFailsLast: its own check failed.");
    }
  }
};

} // namespace lamp_test
