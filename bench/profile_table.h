#pragma once

// lamp_bench --profile, the arithmetic: what the events of a few profiled
// training steps add up to, per kernel class (time per step, share of the
// step, TFLOP/s or GB/s), and a Chrome trace written from the events where
// the LibTorch has no Kineto to write one. Plain data in, text out: nothing
// here touches the profiler, so the sums are unit-tested on made-up events
// (bench/profile_table_test.cpp); bench/profiler.cpp collects the events,
// kernel_class.h holds the rules.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_class.h"

namespace lamp_bench {

/// One event of the profiler, as bench/profiler.cpp copies it out.
struct ProfiledEvent {
  std::string name;
  /// Ran on the GPU (a kernel, memcpy or memset); the others are host
  /// events: ATen ops, RecordFunction scopes, CUDA runtime calls.
  bool device = false;
  /// The host thread, or for a device event its stream.
  uint64_t thread = 0;
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
  /// A host event's id; a device event's linked_correlation is the id of
  /// the op that launched it (0: none known).
  uint64_t correlation = 0;
  uint64_t linked_correlation = 0;
  /// The inputs' shapes and dtypes (record_shapes) and the profiler's FLOP
  /// estimate (with_flops; 0 where it has none).
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> dtypes;
  int64_t flops = 0;
};

/// What the table is computed from besides the events.
struct ProfileRun {
  /// The device's kernels are the classes' time (CUDA); otherwise the host
  /// ops' (CPU).
  bool device_kernels = false;
  int64_t steps = 1;
  /// Wall time of the profiled steps, device synchronised at both ends.
  double seconds = 0;
  /// The shape of the batch fed to the model: a convolution whose input has
  /// it computes no input gradient (the batch needs none), which the CPU's
  /// combined backward op does not show.
  std::vector<int64_t> input_shape;
};

/// One row of the table.
struct ClassRow {
  KernelClass kernel_class = KernelClass::kOther;
  double seconds = 0; ///< over all profiled steps
  double flops = 0;   ///< over `rated_seconds`
  double bytes = 0;   ///< over `rated_seconds`
  /// The part of `seconds` whose FLOPs or bytes are known: the rate is
  /// flops (or bytes) / rated_seconds.
  double rated_seconds = 0;
};

/// The table: one row per kernel_classes() entry, and the step's time that
/// no class holds (host time outside any op on the CPU, time with no kernel
/// running on the GPU).
struct ProfileTable {
  ProfileRun run;
  std::vector<ClassRow> rows;
  double unaccounted_seconds = 0;
  int64_t events = 0;
};

/// Sorts the events into classes (classify(), with each host op's phase
/// from the scopes around it and each kernel's from the op that launched
/// it) and adds up their time, FLOPs and bytes.
///  - CPU: a class holds the whole time of the outermost op it classifies
///    (its children included); "other" holds the rest of the ops' time.
///  - CUDA: each kernel's time goes to its class by its name, or, where the
///    name says nothing, to the class of the op that launched it.
///  - FLOPs: convolution forward from the profiler's estimate, backward from
///    the shapes (one forward's count per direction computed). Bytes: the
///    least traffic of the outermost op with known traffic (traffic_bytes()).
ProfileTable summarize(const std::vector<ProfiledEvent>& events,
                       const ProfileRun& run);

/// The least part of a class's time its rate must cover to be printed.
constexpr double kMinRatedShare = 0.5;

/// The table as printed: one line per class with ms per step, share of the
/// step, TFLOP/s (convolutions) or GB/s (the others) and "rated", the part of
/// the class's time whose FLOPs or bytes are known; a rate is "-" where that
/// part is below kMinRatedShare. Then the unaccounted line and the step.
std::string format_table(const ProfileTable& table);

/// One kernel name's share of the profiled steps.
struct KernelTotal {
  std::string name;
  int64_t launches = 0; ///< over all profiled steps
  double seconds = 0;   ///< over all profiled steps
};

/// The `count` kernels that took the most GPU time, by name, largest first
/// (ties by name); none where the run's classes are host ops (the CPU). What
/// a kernel-by-kernel comparison with another tool's profile starts from.
std::vector<KernelTotal> top_kernels(const std::vector<ProfiledEvent>& events,
                                     const ProfileRun& run, size_t count);

/// The top kernels as printed: ms per step, share of the step, launches per
/// step and the name, cut to `kTopNameChars` characters.
std::string format_top_kernels(const std::vector<KernelTotal>& kernels,
                               const ProfileRun& run);
constexpr size_t kTopNameChars = 100;

/// The trace file of one configuration of a run: `path` itself when the
/// run has only one, otherwise `path` with "-" + `label` before the first
/// dot of its file name ("out/step.json", "amp-bf16" ->
/// "out/step-amp-bf16.json"; "out/step" -> "out/step-amp-bf16").
std::string trace_path_for(const std::string& path, const std::string& label,
                           bool several);

/// Whether `a` and `b` name one file: the same existing file (links and
/// "./" spellings included), or, where one does not exist yet, the same
/// absolute path once "." and ".." are resolved.
bool same_file(const std::string& a, const std::string& b);

/// The events in Chrome's trace event format ({"traceEvents": [...]}, "X"
/// events in microseconds, input shapes and dtypes as args): what
/// chrome://tracing and Perfetto open.
nlohmann::json chrome_trace(const std::vector<ProfiledEvent>& events);

} // namespace lamp_bench
