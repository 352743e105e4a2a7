#include "profiler.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <lamp/platform/backends.h>
#include <nlohmann/json.hpp>

#define LAMP_COMPAT_PROFILER
#include "platform/compat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace lamp_bench {
namespace {

namespace profiler = torch::autograd::profiler;
namespace profiler_impl = torch::profiler::impl;

// Host events and the device's own work; Kineto's GPU annotations and
// syncs (device events that are no work of their own) are left out.
bool wanted(const profiler::KinetoEvent& e) {
  return e.deviceType() == c10::DeviceType::CPU ||
         lamp::detail::profiler_device_work(e);
}

ProfiledEvent copy_event(const profiler::KinetoEvent& e) {
  ProfiledEvent out;
  out.name = e.name();
  out.device = e.deviceType() != c10::DeviceType::CPU;
  out.thread = out.device ? static_cast<uint64_t>(e.deviceResourceId())
                          : e.startThreadId();
  out.start_ns = lamp::detail::profiler_start_ns(e);
  out.duration_ns = lamp::detail::profiler_duration_ns(e);
  out.correlation = e.correlationId();
  out.linked_correlation = e.linkedCorrelationId();
  if (e.hasShapes()) {
    const auto shapes = e.shapes();
    out.shapes.assign(shapes.begin(), shapes.end());
  }
  if (e.hasTypes()) {
    const auto dtypes = e.dtypes();
    out.dtypes.assign(dtypes.begin(), dtypes.end());
  }
  out.flops = static_cast<int64_t>(e.flops());
  return out;
}

// The trace is written here first and renamed over the path once it reads
// back as a trace: a run that dies before then leaves an earlier trace as
// it was.
std::string temporary_trace_path(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

// Removes the temporary trace unless it was renamed into place.
class TemporaryTrace {
 public:
  explicit TemporaryTrace(std::string path) : path_(std::move(path)) {}
  ~TemporaryTrace() {
    if (!kept_) {
      std::remove(path_.c_str());
    }
  }
  TemporaryTrace(const TemporaryTrace&) = delete;
  TemporaryTrace& operator=(const TemporaryTrace&) = delete;

  const std::string& path() const { return path_; }
  void keep() { kept_ = true; }

 private:
  std::string path_;
  bool kept_ = false;
};

// Kineto's own trace where this LibTorch has Kineto; otherwise ours, from
// the events. Debian's LibTorch 1.13 is built without it: its profiler
// records the host ops all the same, but save() refuses ("Saving a trace
// requires using torch.profiler with Kineto support (USE_KINETO=1)").
std::string write_trace(profiler::ProfilerResult& result,
                        const std::vector<ProfiledEvent>& events,
                        const std::string& file_path, const std::string& path) {
  try {
    result.save(file_path);
    return "Kineto";
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("USE_KINETO") ==
        std::string::npos) {
      throw;
    }
  }
  errno = 0;
  std::ofstream file(file_path, std::ios::trunc);
  TORCH_CHECK(file.is_open(), "--profile: cannot write the trace for ", path,
              " to ", file_path, " (", std::strerror(errno), ").");
  file << chrome_trace(events).dump() << "\n";
  file.close();
  TORCH_CHECK(!file.fail(), "--profile: writing the trace for ", path, " to ",
              file_path, " failed (", std::strerror(errno), ").");
  return "lamp_bench";
}

// Kineto reports a trace it could not write only in its log: read it back
// (from `file_path`, the temporary file of the trace for `path`).
int64_t count_trace_events(const std::string& file_path,
                           const std::string& path) {
  std::ifstream file(file_path);
  TORCH_CHECK(file.is_open(), "--profile: the trace for ", path,
              " was not written to ", file_path, " (", std::strerror(errno),
              ").");
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "--profile: the trace written for ", path,
                " is not valid JSON: ", e.what());
  }
  TORCH_CHECK(
      trace.is_object() && trace.contains("traceEvents") &&
          trace["traceEvents"].is_array() && !trace["traceEvents"].empty(),
      "--profile: the trace written for ", path, " has no traceEvents.");
  return static_cast<int64_t>(trace["traceEvents"].size());
}

} // namespace

void check_trace_path(const std::string& path) {
  // Renaming the trace over a device, a FIFO, a folder or a link would
  // replace it.
  struct stat info {};
  TORCH_CHECK(::lstat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode),
              "--profile: cannot write ", path,
              " (it exists and is not a regular file, which the trace, "
              "renamed over it, would replace); give the path of a regular "
              "file.");
  const std::string probe = temporary_trace_path(path);
  const int fd =
      ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "--profile: cannot write ", path, " (",
              std::strerror(errno),
              "); check that its folder exists and is writable.");
  ::close(fd);
  std::remove(probe.c_str());
}

ProfileCapture profile_steps(const torch::Device& device, int64_t steps,
                             const std::function<void()>& step,
                             const std::string& trace_path) {
  const profiler_impl::ProfilerConfig config(
      profiler_impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
      /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/true);
  std::set<profiler_impl::ActivityType> activities = {
      profiler_impl::ActivityType::CPU};
  if (device.is_cuda()) {
    activities.insert(profiler_impl::ActivityType::CUDA);
  }
  lamp::synchronize(device);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  ProfileCapture capture;
  try {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      RECORD_USER_SCOPE(kStepScope);
      step();
    }
    lamp::synchronize(device);
    capture.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  } catch (...) {
    profiler::disableProfiler();
    throw;
  }
  const auto result = profiler::disableProfiler();
  for (const auto& event : result->events()) {
    if (wanted(event)) {
      capture.events.push_back(copy_event(event));
    }
  }
  TemporaryTrace temporary(temporary_trace_path(trace_path));
  capture.trace_writer =
      write_trace(*result, capture.events, temporary.path(), trace_path);
  capture.trace_events = count_trace_events(temporary.path(), trace_path);
  TORCH_CHECK(std::rename(temporary.path().c_str(), trace_path.c_str()) == 0,
              "--profile: cannot write ", trace_path, " (renaming ",
              temporary.path(), " over it: ", std::strerror(errno), ").");
  temporary.keep();
  return capture;
}

} // namespace lamp_bench
