#include "lamp/amp/precision_support.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "lamp/amp/autocast.h"
#include "lamp/nn/float8.h"
#include "platform/compat.h"

namespace lamp {

std::string to_string(SupportLevel level) {
  switch (level) {
    case SupportLevel::kNative:
      return "native";
    case SupportLevel::kEmulated:
      return "emulated";
    case SupportLevel::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

namespace {

// The costs measured for the emulated modes (docs/precision-modes.md has the
// runs). lamp_bench --model cnn --batch-size 64, one process per mode.
constexpr const char* kCpuBf16Cost =
    "measured 16x slower than fp32 (lamp_bench's MNIST CNN on an AVX2 AMD EPYC: 1,339 against 83 images/s)";
constexpr const char* kCpuFp16Cost =
    "measured 11x slower than fp32 (lamp_bench's MNIST CNN, LibTorch 2.11, on an AMD EPYC without AVX512-FP16: 9,936 against 861 images/s)";

constexpr const char* kCpuFp8Cost =
    "measured 1.5x slower than fp32 and 3.4x slower than amp-bf16 (lamp_bench's GPT, 4 layers, width 256, one thread, LibTorch 2.15, on an AMD EPYC with AVX512-BF16: 2,739 against 4,167 and 9,443 tokens/s)";

ModeSupport mode(Precision precision, SupportLevel level, std::string reason,
                 std::string cost = {}) {
  ModeSupport m;
  m.precision = precision;
  m.level = level;
  m.reason = std::move(reason);
  m.cost = std::move(cost);
  return m;
}

// "fp8" on the CPU: no CPU has FP8 matrix hardware; LibTorch 2.x emulates
// _scaled_mm (for numerics, not speed), 1.13 has no float8 types.
ModeSupport cpu_fp8() {
  const auto reason = nn::float8_unavailable_reason(torch::kCPU);
  if (!reason.empty()) {
    return mode(Precision::kFP8, SupportLevel::kUnavailable, reason);
  }
  return mode(
      Precision::kFP8, SupportLevel::kEmulated,
      "no CPU has FP8 matrix units: LibTorch's CPU _scaled_mm emulates the FP8 products (correct numerics, for testing)",
      kCpuFp8Cost);
}

// "fp8" on a GPU: FP8 tensor cores from sm_89 (Ada) on, and a LibTorch
// with float8 types.
ModeSupport cuda_fp8(const DeviceCapabilities& d, const std::string& sm) {
  if (!LAMP_TORCH_FLOAT8) {
    return mode(Precision::kFP8, SupportLevel::kUnavailable,
                "this LibTorch has no float8 types (LibTorch 2.5 and newer)");
  }
  return d.sm() >= 89 ? mode(Precision::kFP8, SupportLevel::kNative,
                             sm + " has FP8 tensor cores (sm_89 and later)")
                      : mode(Precision::kFP8, SupportLevel::kUnavailable,
                             sm + " has no FP8 tensor cores (sm_89 and later)");
}

ModeSupport same_as_fp32(std::string reason) {
  auto m = mode(Precision::kTF32, SupportLevel::kNative, std::move(reason));
  m.same_as_fp32 = true;
  return m;
}

std::vector<ModeSupport> cpu_modes(const DeviceCapabilities& d,
                                   bool fp16_autocast) {
  const bool bf16 = d.avx512_bf16 || d.amx_bf16;
  const auto bf16_level =
      bf16 ? SupportLevel::kNative : SupportLevel::kEmulated;
  const auto bf16_reason =
      bf16 ? "the CPU has " + d.cpu_bf16_hardware()
           : "the CPU has " + d.cpu_bf16_hardware() +
                 ": BF16 math runs through conversions to FP32";
  const auto bf16_cost = bf16 ? "" : kCpuBf16Cost;
  SupportLevel fp16_level = SupportLevel::kUnavailable;
  std::string fp16_reason =
      "this LibTorch has no FP16 convolution or matmul kernels for the CPU (LibTorch 2.x has them)";
  std::string fp16_cost;
  if (d.fp16_kernels) {
    const bool fp16 = d.avx512_fp16 || d.amx_fp16;
    fp16_level = fp16 ? SupportLevel::kNative : SupportLevel::kEmulated;
    fp16_reason = fp16 ? std::string("the CPU has ") +
                             (d.avx512_fp16 ? "AVX512-FP16" : "AMX-FP16")
                       : "the CPU has no AVX512-FP16 or AMX-FP16: FP16 math "
                         "runs through conversions to FP32";
    fp16_cost = fp16 ? "" : kCpuFp16Cost;
  }
  // "amp" is FP16 autocast: the kernels alone are not enough where the
  // autocast guard refuses FP16 on the CPU (LibTorch 2.0 to 2.3 have the
  // kernels, not the autocast).
  auto amp =
      fp16_autocast
          ? mode(Precision::kAMP, fp16_level, fp16_reason, fp16_cost)
          : mode(
                Precision::kAMP, SupportLevel::kUnavailable,
                "this LibTorch's CPU autocast takes no FP16 (LibTorch 2.4 and newer autocast the CPU to FP16)");
  return {
      mode(Precision::kFP32, SupportLevel::kNative, "FP32 on the CPU"),
      same_as_fp32(
          "TF32 is a tensor-core format of NVIDIA GPUs (sm_80 and later); on the CPU this mode computes in FP32, as fp32 does"),
      std::move(amp),
      mode(Precision::kAMPBF16, bf16_level, bf16_reason, bf16_cost),
      mode(Precision::kHalf, fp16_level, fp16_reason, fp16_cost),
      mode(Precision::kBF16, bf16_level, bf16_reason, bf16_cost),
      cpu_fp8(),
  };
}

std::vector<ModeSupport> cuda_modes(const DeviceCapabilities& d) {
  const auto sm = "sm_" + std::to_string(d.sm());
  if (d.sm() == 0) {
    std::vector<ModeSupport> modes;
    for (const auto precision : concrete_precisions()) {
      modes.push_back(mode(precision, SupportLevel::kUnavailable,
                           "no usable CUDA GPU in this process"));
    }
    return modes;
  }
  const bool tensor_fp16 = d.sm() >= 70;
  const bool tensor_bf16 = d.sm() >= 80;
  auto tf32 =
      tensor_bf16
          ? mode(Precision::kTF32, SupportLevel::kNative,
                 sm + " has TF32 tensor cores (sm_80 and later)")
          : same_as_fp32(
                sm +
                " has no TF32 (sm_80 and later); this mode computes in FP32, as fp32 does");
  // Native on tensor cores, emulated without them.
  const auto tensor_cores = [&](Precision precision, bool has,
                                const std::string& kind, const char* from,
                                const std::string& without) {
    return has ? mode(precision, SupportLevel::kNative,
                      sm + " has " + kind + " tensor cores (" + from +
                          " and later)")
               : mode(precision, SupportLevel::kEmulated,
                      sm + " has no " + kind + " tensor cores (" + from +
                          " and later)" + without);
  };
  const auto fp16 = [&](Precision precision) {
    return tensor_cores(precision, tensor_fp16, "FP16", "sm_70",
                        "; Keras warns below 7.0 for the same reason");
  };
  const auto bf16 = [&](Precision precision) {
    return tensor_cores(precision, tensor_bf16, "BF16", "sm_80",
                        ": cuBLAS and cuDNN compute BF16 through FP32");
  };
  return {
      mode(Precision::kFP32, SupportLevel::kNative, "FP32 on " + sm),
      tf32,
      fp16(Precision::kAMP),
      bf16(Precision::kAMPBF16),
      fp16(Precision::kHalf),
      bf16(Precision::kBF16),
      cuda_fp8(d, sm),
  };
}

// What "auto" picks, and why: the table of docs/precision-modes.md.
std::pair<Precision, std::string> automatic_mode(
    const DeviceCapabilities& d, const std::vector<ModeSupport>& modes) {
  const auto level = [&](Precision p) {
    return modes[static_cast<size_t>(p)].level;
  };
  if (level(Precision::kFP32) == SupportLevel::kUnavailable) {
    // A CUDA device without a GPU: "auto" still names a mode, so that it
    // resolves, and the run fails on the device rather than on the mode.
    return {Precision::kFP32,
            "nothing runs here, fp32 included: " +
                modes[static_cast<size_t>(Precision::kFP32)].reason};
  }
  if (level(Precision::kAMPBF16) == SupportLevel::kNative) {
    return {
        Precision::kAMPBF16,
        d.type == torch::kCPU
            ? "BF16 is native here and autocast keeps fp32's accuracy without loss scaling; whether it is faster than fp32 depends on the model and on the CPU's BF16 units (measured from 0.66x for a convolution net without AMX to 2.3x for a GPT), so lamp's programs time both on the run's first batch and take the faster"
            : "BF16 tensor cores run as fast as FP16 ones from sm_80 on, and BF16 has FP32's range: no loss scaling, no skipped steps"};
  }
  if (level(Precision::kAMP) == SupportLevel::kNative &&
      d.type == torch::kCUDA) {
    return {
        Precision::kAMP,
        "FP16 tensor cores, but no BF16 ones: autocast FP16 with dynamic loss scaling"};
  }
  return {
      Precision::kFP32,
      d.type == torch::kCPU
          ? "no mixed-precision mode is native on this CPU; the emulated ones are slower than fp32"
          : "no mixed-precision mode is native here"};
}

} // namespace

const ModeSupport& PrecisionSupport::of(Precision precision) const& {
  const auto p = precision == Precision::kAuto ? automatic : precision;
  const auto found =
      std::find_if(modes.begin(), modes.end(),
                   [&](const ModeSupport& m) { return m.precision == p; });
  TORCH_CHECK(found != modes.end(),
              "PrecisionSupport::of: the table has no entry for '",
              lamp::to_string(p),
              "'; build it with lamp::precision_support(), which "
              "lists every concrete mode");
  return *found;
}

ModeSupport PrecisionSupport::of(Precision precision) && {
  // A copy: a reference into a temporary table would dangle at the end of
  // the full expression (`const auto& m = precision_support(d).of(p);`).
  return static_cast<const PrecisionSupport&>(*this).of(precision);
}

std::string PrecisionSupport::to_string() const {
  std::ostringstream out;
  out << "precision support on " << c10::DeviceTypeName(device.type, true)
      << " (" << device.name;
  if (device.type == torch::kCPU) {
    out << "; " << device.cpu_bf16_hardware() << "; from " << device.source;
  } else if (device.type == torch::kCUDA && device.sm() > 0) {
    out << "; sm_" << device.sm()
        << (device.sm() >= 89 ? "; FP8 tensor cores" : "");
  }
  out << "):\n";
  for (const auto& m : modes) {
    char line[32];
    std::snprintf(line, sizeof(line), "  %-9s %-12s ",
                  lamp::to_string(m.precision).c_str(),
                  lamp::to_string(m.level).c_str());
    out << line << m.reason;
    if (!m.cost.empty()) {
      out << "; " << m.cost;
    }
    out << "\n";
  }
  out << "auto: " << lamp::to_string(automatic) << " (" << automatic_reason
      << ")\n";
  return out.str();
}

PrecisionSupport precision_support(const DeviceCapabilities& device) {
  return precision_support(device,
                           Autocast::is_supported(torch::kCPU, torch::kHalf));
}

PrecisionSupport precision_support(const DeviceCapabilities& device,
                                   bool cpu_fp16_autocast) {
  PrecisionSupport support;
  support.device = device;
  if (device.type == torch::kCPU) {
    support.modes = cpu_modes(device, cpu_fp16_autocast);
  } else if (device.type == torch::kCUDA) {
    support.modes = cuda_modes(device);
  } else {
    for (const auto precision : concrete_precisions()) {
      support.modes.push_back(
          mode(precision,
               precision == Precision::kFP32 ? SupportLevel::kNative
                                             : SupportLevel::kUnavailable,
               "lamp knows only the CPU's and CUDA's low-precision hardware"));
    }
  }
  auto automatic = automatic_mode(device, support.modes);
  support.automatic = automatic.first;
  support.automatic_reason = std::move(automatic.second);
  return support;
}

PrecisionSupport precision_support(const torch::Device& device) {
  return precision_support(device_capabilities(device));
}

Precision resolve_precision(Precision precision, const torch::Device& device) {
  return precision == Precision::kAuto ? precision_support(device).automatic
                                       : precision;
}

std::string precision_warning(Precision precision,
                              const PrecisionSupport& support) {
  const auto& m = support.of(precision);
  const auto name = lamp::to_string(m.precision);
  const auto where =
      std::string(c10::DeviceTypeName(support.device.type, true)) + " (" +
      support.device.name + ")";
  if (m.same_as_fp32) {
    return "lamp: precision '" + name + "' has no effect on " + where + ": " +
           m.reason + ". Use fp32 to say so.";
  }
  if (m.level != SupportLevel::kEmulated) {
    return "";
  }
  std::string text = "lamp: precision '" + name + "' is emulated on " + where +
                     ": " + m.reason;
  if (!m.cost.empty()) {
    text += "; " + m.cost;
  }
  const auto best = lamp::to_string(support.automatic);
  return text + ". Precision '" + best +
         "' is faster here (precision 'auto' picks it).";
}

bool warn_precision_once(Precision precision, const torch::Device& device) {
  const auto support = precision_support(device);
  const auto text = precision_warning(precision, support);
  if (text.empty()) {
    return false;
  }
  static std::mutex mutex;
  static std::set<std::pair<int, int>> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto key =
        std::make_pair(static_cast<int>(device.type()),
                       static_cast<int>(support.of(precision).precision));
    if (!warned.insert(key).second) {
      return false;
    }
  }
  TORCH_WARN(text);
  return true;
}

std::string suggest_low_precision(const torch::Device& device) {
  const auto support = precision_support(device);
  const auto& bf16 = support.of(Precision::kAMPBF16);
  if (bf16.level == SupportLevel::kNative) {
    return "precision 'amp-bf16' or 'bf16'";
  }
  if (bf16.level == SupportLevel::kEmulated) {
    return "precision 'fp32' (amp-bf16 and bf16 run here, but emulated: " +
           bf16.reason + (bf16.cost.empty() ? "" : "; " + bf16.cost) + ")";
  }
  return "precision 'fp32'";
}

} // namespace lamp
