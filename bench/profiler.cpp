#include "profiler.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <lamp/platform/backends.h>
#include <nlohmann/json.hpp>

#define LAMP_COMPAT_PROFILER
#include "platform/compat.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>

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

// Kineto's own trace where this LibTorch has Kineto; otherwise ours, from
// the events. Debian's LibTorch 1.13 is built without it: its profiler
// records the host ops all the same, but save() refuses ("Saving a trace
// requires using torch.profiler with Kineto support (USE_KINETO=1)").
std::string write_trace(profiler::ProfilerResult& result,
                        const std::vector<ProfiledEvent>& events,
                        const std::string& path) {
  try {
    result.save(path);
    return "Kineto";
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("USE_KINETO") ==
        std::string::npos) {
      throw;
    }
  }
  errno = 0;
  std::ofstream file(path, std::ios::trunc);
  TORCH_CHECK(file.is_open(), "--profile: cannot write ", path, " (",
              std::strerror(errno), ").");
  file << chrome_trace(events).dump() << "\n";
  file.close();
  TORCH_CHECK(!file.fail(), "--profile: writing ", path, " failed (",
              std::strerror(errno), ").");
  return "lamp_bench";
}

// Kineto reports a trace it could not write only in its log: read it back.
int64_t count_trace_events(const std::string& path) {
  std::ifstream file(path);
  TORCH_CHECK(file.is_open(), "--profile: the trace ", path,
              " was not written (", std::strerror(errno), ").");
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "--profile: the trace written to ", path,
                " is not valid JSON: ", e.what());
  }
  TORCH_CHECK(trace.is_object() && trace.contains("traceEvents") &&
                  trace["traceEvents"].is_array() &&
                  !trace["traceEvents"].empty(),
              "--profile: the trace written to ", path, " has no traceEvents.");
  return static_cast<int64_t>(trace["traceEvents"].size());
}

} // namespace

void check_trace_path(const std::string& path) {
  errno = 0;
  std::ofstream file(path, std::ios::trunc);
  TORCH_CHECK(file.is_open(), "--profile: cannot write ", path, " (",
              std::strerror(errno),
              "); check that its folder exists and is writable.");
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
  capture.trace_writer = write_trace(*result, capture.events, trace_path);
  capture.trace_events = count_trace_events(trace_path);
  return capture;
}

} // namespace lamp_bench
