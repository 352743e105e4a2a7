// What each precision mode costs on a device, "auto"'s choice and the
// warnings: every branch of the decision driven by hand-made capabilities,
// then the real query of this machine checked against /proc/cpuinfo.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lamp/amp/autocast.h"
#include "lamp/amp/precision_support.h"
#include "lamp/amp/train_step.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/warnings.h"
#include "platform/compat.h"
#include "platform/cpuid.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp::DeviceCapabilities;
using lamp::Precision;
using lamp::SupportLevel;

DeviceCapabilities cpu(bool bf16, bool fp16_kernels, bool fp16 = false) {
  DeviceCapabilities d;
  d.type = torch::kCPU;
  d.name = "Test CPU";
  d.source = "test";
  d.avx2 = true;
  d.avx512 = bf16 || fp16;
  d.avx512_bf16 = bf16;
  d.avx512_fp16 = fp16;
  d.fp16_kernels = fp16_kernels;
  return d;
}

DeviceCapabilities gpu(int major, int minor) {
  DeviceCapabilities d;
  d.type = torch::kCUDA;
  d.name = "Test GPU";
  d.compute_major = major;
  d.compute_minor = minor;
  d.fp16_kernels = major > 0;
  return d;
}

// The levels of fp32, tf32, amp, amp-bf16, half, bf16, fp8, in that order.
std::vector<SupportLevel> levels(const lamp::PrecisionSupport& support) {
  std::vector<SupportLevel> out;
  for (const auto& m : support.modes) {
    out.push_back(m.level);
  }
  return out;
}

constexpr auto N = SupportLevel::kNative;
constexpr auto E = SupportLevel::kEmulated;
constexpr auto U = SupportLevel::kUnavailable;
// fp8 on a CPU: emulated where the LibTorch has float8 types (and the CPU
// _scaled_mm, as 2.15 has), unavailable on 1.13; on sm_89 and newer: native
// with float8 types.
constexpr auto CPU8 =
    LAMP_TORCH_FLOAT8 ? SupportLevel::kEmulated : SupportLevel::kUnavailable;
constexpr auto GPU8 =
    LAMP_TORCH_FLOAT8 ? SupportLevel::kNative : SupportLevel::kUnavailable;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PrecisionSupport, CpuWithBf16HardwarePicksAutocastBf16) {
  const auto s = lamp::precision_support(cpu(true, false));
  ASSERT_EQ(s.modes.size(), lamp::concrete_precisions().size());
  EXPECT_EQ(levels(s), (std::vector<SupportLevel>{N, N, U, N, U, N, CPU8}));
  EXPECT_EQ(s.automatic, Precision::kAMPBF16);
  EXPECT_TRUE(contains(s.of(Precision::kBF16).reason, "AVX512-BF16"));
  EXPECT_EQ(s.of(Precision::kAuto).precision, Precision::kAMPBF16);
  EXPECT_EQ(lamp::precision_warning(Precision::kAMPBF16, s), "");
  EXPECT_EQ(lamp::precision_warning(Precision::kFP32, s), "");
  // AMX alone counts as BF16 hardware too.
  auto amx = cpu(false, false);
  amx.amx_bf16 = true;
  EXPECT_EQ(lamp::precision_support(amx).automatic, Precision::kAMPBF16);
}

TEST(PrecisionSupport, CpuWithoutBf16HardwareEmulatesItAndPicksFp32) {
  const auto s = lamp::precision_support(cpu(false, false));
  EXPECT_EQ(levels(s), (std::vector<SupportLevel>{N, N, U, E, U, E, CPU8}));
  EXPECT_EQ(s.automatic, Precision::kFP32);
  const auto& bf16 = s.of(Precision::kAMPBF16);
  EXPECT_TRUE(contains(bf16.reason, "no AVX512-BF16 or AMX-BF16"));
  EXPECT_TRUE(contains(bf16.cost, "16x slower than fp32"));
  const auto warning = lamp::precision_warning(Precision::kBF16, s);
  EXPECT_TRUE(contains(warning, "precision 'bf16' is emulated on cpu"))
      << warning;
  EXPECT_TRUE(contains(warning, "16x slower")) << warning;
  EXPECT_TRUE(contains(warning, "Precision 'fp32' is faster here")) << warning;
}

TEST(PrecisionSupport, CpuFp16DependsOnTheLibTorchAndTheHardware) {
  // LibTorch 1.13: no FP16 CPU kernels at all, nor FP16 CPU autocast.
  const auto none = lamp::precision_support(cpu(true, false), false);
  EXPECT_EQ(none.of(Precision::kAMP).level, U);
  EXPECT_EQ(none.of(Precision::kHalf).level, U);
  EXPECT_TRUE(contains(none.of(Precision::kHalf).reason, "no FP16"));
  // LibTorch 2.4 and newer: the kernels and FP16 autocast, emulated without
  // AVX512-FP16 or AMX-FP16.
  const auto emulated = lamp::precision_support(cpu(true, true), true);
  EXPECT_EQ(emulated.of(Precision::kAMP).level, E);
  EXPECT_EQ(emulated.of(Precision::kHalf).level, E);
  EXPECT_TRUE(contains(emulated.of(Precision::kAMP).cost, "slower than fp32"));
  EXPECT_EQ(emulated.automatic, Precision::kAMPBF16);
  const auto native = lamp::precision_support(cpu(true, true, true), true);
  EXPECT_EQ(native.of(Precision::kAMP).level, N);
  EXPECT_TRUE(contains(native.of(Precision::kAMP).reason, "AVX512-FP16"));
  // A CPU's auto never picks FP16: no loss scaling where BF16 is there.
  EXPECT_EQ(native.automatic, Precision::kAMPBF16);
  EXPECT_EQ(lamp::precision_support(cpu(false, true, true), true).automatic,
            Precision::kFP32);
}

// "amp" is FP16 autocast: LibTorch 2.0 to 2.3 have the FP16 CPU kernels
// ("half" runs) but their CPU autocast refuses FP16, so "amp" cannot run
// there, whatever the hardware.
TEST(PrecisionSupport, CpuAmpNeedsFp16AutocastBesidesTheKernels) {
  for (const bool fp16_hardware : {false, true}) {
    SCOPED_TRACE(fp16_hardware ? "AVX512-FP16" : "no FP16 hardware");
    const auto d = cpu(true, /*fp16_kernels=*/true, fp16_hardware);
    const auto kernels_only =
        lamp::precision_support(d, /*cpu_fp16_autocast=*/false);
    const auto& amp = kernels_only.of(Precision::kAMP);
    EXPECT_EQ(amp.level, U);
    EXPECT_TRUE(contains(amp.reason, "CPU autocast takes no FP16"))
        << amp.reason;
    EXPECT_TRUE(contains(amp.reason, "LibTorch 2.4")) << amp.reason;
    EXPECT_EQ(kernels_only.of(Precision::kHalf).level, fp16_hardware ? N : E);
    const auto both = lamp::precision_support(d, /*cpu_fp16_autocast=*/true);
    EXPECT_EQ(both.of(Precision::kAMP).level, fp16_hardware ? N : E);
  }
  // The one-argument form asks this LibTorch, by the rule lamp::Autocast
  // (and so TrainStep) refuses FP16 on the CPU with.
  const bool autocast = lamp::Autocast::is_supported(torch::kCPU, torch::kHalf);
  const auto d = cpu(true, true);
  EXPECT_EQ(levels(lamp::precision_support(d)),
            levels(lamp::precision_support(d, autocast)));
  if (!autocast) {
    EXPECT_EQ(lamp::precision_support(torch::Device(torch::kCPU))
                  .of(Precision::kAMP)
                  .level,
              U);
  }
}

TEST(PrecisionSupport, AnEntryOfATemporaryTableIsACopy) {
  // A reference into a table that dies at the end of the statement would
  // dangle; on a temporary, of() returns the entry by value (bound to the
  // reference below, it lives as long as the reference).
  static_assert(
      std::is_same_v<decltype(std::declval<lamp::PrecisionSupport>().of(
                         Precision::kFP32)),
                     lamp::ModeSupport>,
      "of() on a temporary table must return a copy");
  static_assert(
      std::is_same_v<decltype(std::declval<const lamp::PrecisionSupport&>().of(
                         Precision::kFP32)),
                     const lamp::ModeSupport&>,
      "of() on a named table returns a reference into it");
  const auto& bf16 =
      lamp::precision_support(cpu(false, false)).of(Precision::kAMPBF16);
  EXPECT_EQ(bf16.precision, Precision::kAMPBF16);
  EXPECT_TRUE(contains(bf16.reason, "no AVX512-BF16 or AMX-BF16"))
      << bf16.reason;
  const auto& chosen =
      lamp::precision_support(cpu(true, false)).of(Precision::kAuto);
  EXPECT_EQ(chosen.precision, Precision::kAMPBF16);
}

TEST(PrecisionSupport, ATableWithoutTheModeSaysSo) {
  lamp::PrecisionSupport by_hand; // no modes: not from precision_support()
  const auto message =
      lamp_test::error_of([&] { (void)by_hand.of(Precision::kAMP); });
  EXPECT_TRUE(contains(message,
                       "PrecisionSupport::of: the table has no entry "
                       "for 'amp'"))
      << message;
  EXPECT_TRUE(contains(message, "lamp::precision_support()")) << message;
  // kAuto looks up `automatic` (fp32 by default).
  EXPECT_TRUE(contains(lamp_test::error_of([] {
                         (void)lamp::PrecisionSupport{}.of(Precision::kAuto);
                       }),
                       "no entry for 'fp32'"));
}

TEST(PrecisionSupport, Tf32OnACpuIsFp32AndSaysSo) {
  const auto s = lamp::precision_support(cpu(true, false));
  const auto& tf32 = s.of(Precision::kTF32);
  EXPECT_EQ(tf32.level, N);
  EXPECT_TRUE(tf32.same_as_fp32);
  const auto warning = lamp::precision_warning(Precision::kTF32, s);
  EXPECT_TRUE(contains(warning, "precision 'tf32' has no effect on cpu"))
      << warning;
}

TEST(PrecisionSupport, GpusByComputeCapability) {
  struct Row {
    int major, minor;
    std::vector<SupportLevel> levels;
    bool tf32_same_as_fp32;
    Precision automatic;
  };
  const Row rows[] = {
      {0, 0, {U, U, U, U, U, U, U}, false, Precision::kFP32}, // no GPU
      {6, 1, {N, N, E, E, E, E, U}, true, Precision::kFP32},  // Pascal
      {7, 0, {N, N, N, E, N, E, U}, true, Precision::kAMP},   // Volta
      {7, 5, {N, N, N, E, N, E, U}, true, Precision::kAMP},   // Turing
      {8, 0, {N, N, N, N, N, N, U}, false, Precision::kAMPBF16},
      {8, 9, {N, N, N, N, N, N, GPU8}, false, Precision::kAMPBF16}, // Ada
      {9, 0, {N, N, N, N, N, N, GPU8}, false, Precision::kAMPBF16},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE("sm_" + std::to_string(row.major * 10 + row.minor));
    const auto s = lamp::precision_support(gpu(row.major, row.minor));
    EXPECT_EQ(levels(s), row.levels);
    EXPECT_EQ(s.of(Precision::kTF32).same_as_fp32, row.tf32_same_as_fp32);
    EXPECT_EQ(s.automatic, row.automatic);
  }
  const auto pascal = lamp::precision_support(gpu(6, 1));
  EXPECT_TRUE(contains(pascal.of(Precision::kAMP).reason,
                       "sm_61 has no FP16 tensor cores"));
  EXPECT_TRUE(contains(lamp::precision_warning(Precision::kAMP, pascal),
                       "precision 'amp' is emulated on cuda"));
  EXPECT_TRUE(contains(lamp::precision_support(gpu(9, 0)).to_string(),
                       "FP8 tensor cores"));
  EXPECT_FALSE(contains(lamp::precision_support(gpu(8, 0)).to_string(),
                        "; FP8 tensor cores"));
  // fp8 below sm_89, or without float8 types (LibTorch 1.13): unavailable,
  // saying which.
  EXPECT_TRUE(contains(
      lamp::precision_support(gpu(8, 0)).of(Precision::kFP8).reason,
      LAMP_TORCH_FLOAT8 ? "sm_80 has no FP8 tensor cores (sm_89 and later)"
                        : "this LibTorch has no float8 types"));
}

// Without a usable GPU nothing runs on CUDA, fp32 included: "auto" still
// resolves, to fp32, and says that nothing runs rather than that fp32 was
// the best choice. Wherever a mode runs, auto's mode does.
TEST(PrecisionSupport, AutoWithoutAGpuIsFp32AndSaysNothingRuns) {
  const auto none = lamp::precision_support(gpu(0, 0));
  EXPECT_EQ(none.automatic, Precision::kFP32);
  EXPECT_EQ(none.of(Precision::kAuto).level, U);
  EXPECT_TRUE(contains(none.automatic_reason,
                       "nothing runs here, fp32 included: no usable CUDA GPU"))
      << none.automatic_reason;
  EXPECT_TRUE(contains(none.to_string(), "\nauto: fp32 (nothing runs here"))
      << none.to_string();
  for (const auto& d :
       {cpu(false, false), cpu(true, false), gpu(6, 1), gpu(7, 5), gpu(8, 0)}) {
    const auto s = lamp::precision_support(d);
    EXPECT_EQ(s.of(Precision::kAuto).level, N) << s.to_string();
  }
}

TEST(PrecisionSupport, TableListsEveryModeAndTheChoice) {
  const auto text = lamp::precision_support(cpu(false, false)).to_string();
  for (const auto& name :
       {"fp32", "tf32", "amp", "amp-bf16", "half", "bf16", "fp8"}) {
    EXPECT_TRUE(contains(text, std::string("\n  ") + name + " ")) << text;
  }
  EXPECT_TRUE(contains(text, "emulated")) << text;
  EXPECT_TRUE(contains(text, "unavailable")) << text;
  EXPECT_TRUE(contains(text, "\nauto: fp32 (")) << text;
}

// The flags /proc/cpuinfo lists for the first CPU (empty where there is no
// such file): an oracle independent of both CPUID and cpuinfo's library.
std::set<std::string> proc_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), {}};
    }
  }
  return {};
}

// Each instruction-set flag of caps against /proc/cpuinfo's `flags`.
void expect_flags_of(const lamp::DeviceCapabilities& caps,
                     const std::set<std::string>& flags) {
  const auto has = [&](const char* flag) { return flags.count(flag) == 1; };
  EXPECT_EQ(caps.avx2, has("avx2"));
  EXPECT_EQ(caps.avx512, has("avx512f") && has("avx512dq") && has("avx512bw") &&
                             has("avx512vl"));
  EXPECT_EQ(caps.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(caps.avx512_fp16, has("avx512_fp16"));
  EXPECT_EQ(caps.amx_bf16, has("amx_bf16") && has("amx_tile"));
  EXPECT_EQ(caps.amx_fp16, has("amx_fp16") && has("amx_tile"));
}

TEST(PrecisionSupport, ThisCpusQueryAgreesWithProcCpuinfo) {
  const auto caps = lamp::device_capabilities(torch::kCPU);
  EXPECT_EQ(caps.type, torch::kCPU);
  EXPECT_FALSE(caps.name.empty());
  EXPECT_FALSE(caps.source.empty());
  EXPECT_EQ(caps.fp16_kernels,
            lamp::fp16_compute_available(torch::Device(torch::kCPU)));
  const auto flags = proc_cpu_flags();
  if (flags.empty()) {
    GTEST_SKIP() << "no /proc/cpuinfo flags to compare with";
  }
  expect_flags_of(caps, flags);
  const bool bf16 = caps.avx512_bf16 || caps.amx_bf16;
  const auto support = lamp::precision_support(torch::Device(torch::kCPU));
  EXPECT_EQ(support.of(Precision::kAMPBF16).level, bf16 ? N : E);
  EXPECT_EQ(support.automatic, bf16 ? Precision::kAMPBF16 : Precision::kFP32);
  EXPECT_EQ(lamp::resolve_precision(Precision::kAuto, torch::kCPU),
            support.automatic);
  EXPECT_EQ(lamp::resolve_precision(Precision::kHalf, torch::kCPU),
            Precision::kHalf);
}

// lamp's own CPUID reading, the CPU's capabilities where LibTorch has no CPU
// capability query (1.13): checked against /proc/cpuinfo on every LibTorch,
// also where the test above reads LibTorch's query instead.
TEST(PrecisionSupport, CpuidAgreesWithProcCpuinfo) {
  lamp::DeviceCapabilities caps;
  if (!lamp::detail::read_cpuid(caps)) {
    GTEST_SKIP() << "not an x86 CPU: no CPUID";
  }
  EXPECT_EQ(caps.source, "CPUID");
  const auto flags = proc_cpu_flags();
  if (flags.empty()) {
    GTEST_SKIP() << "no /proc/cpuinfo flags to compare with";
  }
  expect_flags_of(caps, flags);
}

// A small model and an SGD factory for TrainStep.
std::shared_ptr<torch::nn::Module> small_model() {
  return torch::nn::Sequential(torch::nn::Linear(4, 3)).ptr();
}
lamp::OptimizerFactory sgd() {
  return [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(0.1));
  };
}

TEST(PrecisionSupport, TrainStepResolvesAuto) {
  lamp::TrainStep step(small_model(), sgd(), Precision::kAuto);
  const auto chosen = lamp::resolve_precision(Precision::kAuto, torch::kCPU);
  EXPECT_EQ(step.options().precision(), chosen);
  EXPECT_EQ(step.policy().precision, chosen);
}

// The library's warning through a WarningSink: once per mode and device.
TEST(PrecisionSupport, TrainStepWarnsOnceForAModeWithoutEffect) {
  std::vector<std::string> warnings;
  lamp::WarningSink sink(
      [&](const std::string& message) { warnings.push_back(message); });
  lamp::TrainStep first(small_model(), sgd(), Precision::kTF32);
  lamp::TrainStep second(small_model(), sgd(), Precision::kTF32);
  lamp::TrainStep fp32(small_model(), sgd(), Precision::kFP32);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(contains(warnings[0], "precision 'tf32' has no effect on cpu"))
      << warnings[0];
  EXPECT_FALSE(lamp::warn_precision_once(Precision::kTF32, torch::kCPU));
}

TEST(WarningSink, CatchesWarningsAndRestoresTheHandlerItFound) {
  std::vector<std::string> outer, inner;
  lamp::WarningSink outer_sink(
      [&](const std::string& message) { outer.push_back(message); });
  {
    lamp::WarningSink inner_sink(
        [&](const std::string& message) { inner.push_back(message); });
    TORCH_WARN("first ", 1);
  }
  TORCH_WARN("second");
  EXPECT_EQ(inner, (std::vector<std::string>{"first 1"}));
  EXPECT_EQ(outer, (std::vector<std::string>{"second"}));
}

// A checkpoint stores the mode "auto" resolved to; a resume with "auto" on
// the same device finds the same mode, one with another mode is refused.
TEST(PrecisionSupport, AutoRoundTripsThroughACheckpointAsTheResolvedMode) {
  using lamp_test::make_run;
  using lamp_test::TrainerOptions;
  const auto checkpoint = lamp_test::temp_path("auto.pt");
  auto run = make_run(Precision::kAuto,
                      TrainerOptions().epochs(1).checkpoint(checkpoint));
  const auto chosen = lamp::resolve_precision(Precision::kAuto, torch::kCPU);
  EXPECT_EQ(run->trainer->train_step().options().precision(), chosen);
  EXPECT_EQ(run->trainer->options().step().precision(), chosen);
  run->trainer->fit();
  EXPECT_EQ(lamp_test::error_of([&] {
              make_run(Precision::kAuto,
                       TrainerOptions().epochs(1).resume(checkpoint));
            }),
            "");
  const auto other =
      chosen == Precision::kFP32 ? Precision::kAMPBF16 : Precision::kFP32;
  EXPECT_TRUE(
      contains(lamp_test::error_of([&] {
                 make_run(other, TrainerOptions().epochs(1).resume(checkpoint));
               }),
               "resume with --precision " + lamp::to_string(chosen)));
  std::remove(checkpoint.c_str());
}

} // namespace
