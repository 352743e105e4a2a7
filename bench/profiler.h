#pragma once

// lamp_bench --profile, the collection: LibTorch's profiler (Kineto's API,
// from C++) around a few training steps, its events copied out for
// profile_table.h, and the Chrome trace written.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "profile_table.h"

namespace lamp_bench {

/// What one profiled run gives.
struct ProfileCapture {
  std::vector<ProfiledEvent> events;
  /// Wall time of the steps, the device synchronised before and after.
  double seconds = 0;
  /// Who wrote the trace: "Kineto", or "lamp_bench" where this LibTorch was
  /// built without Kineto (Debian's 1.13), from the events.
  std::string trace_writer;
  /// The events in the trace file, as read back from it.
  int64_t trace_events = 0;
};

/// Refuses a trace path that cannot be written, before anything runs,
/// without touching it: creates and removes a file beside it (the folder
/// must take the trace's temporary file), and refuses a path that exists and
/// is not a regular file. Throws c10::Error naming the path and the reason.
void check_trace_path(const std::string& path);

/// Runs `step` `steps` times, each inside a kStepScope RecordFunction scope,
/// under LibTorch's profiler: host ops with their input shapes and FLOP
/// estimates, and on a CUDA device its kernels, memcpys and memsets. Writes
/// the Chrome trace to a temporary file beside `trace_path`
/// (`trace_path.tmp-<pid>`), reads it back (a file that does not parse as a
/// trace with events is an error) and renames it over `trace_path`: a run
/// that fails or dies first leaves an earlier trace at `trace_path` as it
/// was.
ProfileCapture profile_steps(const torch::Device& device, int64_t steps,
                             const std::function<void()>& step,
                             const std::string& trace_path);

} // namespace lamp_bench
