#pragma once

/// \file
/// Where warnings go: c10's TORCH_WARN (lamp's precision warnings and
/// LibTorch's own) handed to a callback of the caller's.

#include <functional>
#include <memory>
#include <string>

namespace c10 {
class WarningHandler;
} // namespace c10

namespace lamp {

/// For its lifetime, hands the message of every warning raised on this
/// thread through TORCH_WARN (lamp's, such as warn_precision_once(), and
/// LibTorch's own) to `sink` instead of c10's handler, which prints it on
/// stderr with a source location; then puts back the handler it found.
/// c10's handler is per thread: warnings of other threads go where they
/// went. The same on LibTorch 1.13 and 2.x, whose handler interfaces differ.
///
/// \code
///   lamp::WarningSink sink([](const std::string& message) {
///     std::cerr << "trainer: warning: " << message << "\n";
///   });
///   lamp::TrainStep step(model, make_sgd, lamp::Precision::kAMPBF16);
/// \endcode
class WarningSink {
 public:
  /// Installs a handler calling `sink` with each warning's message.
  explicit WarningSink(std::function<void(const std::string& message)> sink);
  /// Puts back the handler found by the constructor.
  ~WarningSink();
  WarningSink(const WarningSink&) = delete;
  WarningSink& operator=(const WarningSink&) = delete;

 private:
  std::unique_ptr<c10::WarningHandler> handler_;
  c10::WarningHandler* previous_;
};

} // namespace lamp
