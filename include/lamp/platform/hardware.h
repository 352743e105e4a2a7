#pragma once

/// \file
/// What a device's hardware computes natively: the CPU's BF16/FP16
/// instructions, the GPU's compute capability. lamp::precision_support()
/// turns these facts into what each precision mode costs.

#include <torch/types.h>

#include <string>

namespace lamp {

/// The hardware facts the precision modes depend on, for one device. Filled
/// in by device_capabilities(); tests build them by hand to drive every
/// branch of precision_support() without the hardware.
struct DeviceCapabilities {
  /// kCPU or kCUDA (other device types: nothing is known about them).
  torch::DeviceType type = torch::kCPU;
  /// The CPU's model name or the GPU's name ("AMD EPYC", "NVIDIA H100 ...").
  std::string name;
  /// Where the CPU facts came from: "LibTorch's CPU capability query" or
  /// "CPUID"; empty for a GPU.
  std::string source;

  // CPU: instruction sets (x86; all false elsewhere).
  bool avx2 = false;        ///< AVX2 (the vector width LibTorch's CPU kernels
                            ///< use at least, where present)
  bool avx512 = false;      ///< AVX-512 F, BW, VL and DQ
  bool avx512_bf16 = false; ///< AVX512-BF16: BF16 dot products (Cooper Lake,
                            ///< Sapphire Rapids, AMD Zen 4 and later)
  bool amx_bf16 = false;    ///< AMX-BF16 tiles (Sapphire Rapids and later)
  bool avx512_fp16 = false; ///< AVX512-FP16 arithmetic (Sapphire Rapids)
  bool amx_fp16 = false;    ///< AMX-FP16 tiles (Granite Rapids)

  /// CUDA: the compute capability's major number (8 for 8.6; 0 when
  /// unknown or not a GPU).
  int compute_major = 0;
  /// CUDA: the compute capability's minor number (6 for 8.6).
  int compute_minor = 0;

  /// Whether this LibTorch has FP16 convolution and matmul kernels for the
  /// device (fp16_compute_available()): LibTorch 1.13's CPU has none.
  bool fp16_kernels = false;

  /// The compute capability as one number, 80 for 8.0, 90 for 9.0.
  int sm() const { return compute_major * 10 + compute_minor; }
  /// The CPU's BF16 hardware in words: "AVX512-BF16 and AMX-BF16",
  /// "AVX512-BF16", or "no AVX512-BF16 or AMX-BF16".
  std::string cpu_bf16_hardware() const;
};

/// The facts of `device`, found once per process and device (the CPU's from
/// LibTorch's own CPU capability query where the LibTorch has one, from CPUID
/// otherwise; a GPU's from its properties). A CUDA device without a usable
/// GPU gives compute capability 0.0.
DeviceCapabilities device_capabilities(const torch::Device& device);

} // namespace lamp
