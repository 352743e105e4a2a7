#include "lamp/platform/hardware.h"

#include "lamp/platform/backends.h"
#include "platform/compat.h"
#include "platform/cpuid.h"
#include "platform/cuda_name.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define LAMP_X86 1
#else
#define LAMP_X86 0
#endif

#include <string>
#include <vector>

namespace lamp {

std::string DeviceCapabilities::cpu_bf16_hardware() const {
  if (avx512_bf16 && amx_bf16) {
    return "AVX512-BF16 and AMX-BF16";
  }
  if (avx512_bf16 || amx_bf16) {
    return avx512_bf16 ? "AVX512-BF16" : "AMX-BF16";
  }
  return "no AVX512-BF16 or AMX-BF16";
}

namespace {

#if LAMP_X86
// CPUID leaf 7's registers for `subleaf`; zeros where the CPU has no leaf 7.
struct Leaf7 {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};
Leaf7 cpuid_leaf7(unsigned subleaf) {
  Leaf7 r;
  if (__get_cpuid_max(0, nullptr) < 7 ||
      !__get_cpuid_count(7, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) {
    return Leaf7{};
  }
  return r;
}

// The state components the OS saves for this process (XCR0): an instruction
// set the CPU has but the OS does not enable cannot run.
unsigned long long enabled_state() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE)) {
    return 0;
  }
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

#endif

} // namespace

namespace detail {

// The flags from CPUID (Intel SDM vol. 2, CPUID leaf 7), each counted only
// where XCR0 says the OS saves its registers.
bool read_cpuid(DeviceCapabilities& caps) {
#if LAMP_X86
  const auto state = enabled_state();
  const bool avx_state = (state & 0x6) == 0x6;         // SSE, AVX
  const bool avx512_state = (state & 0xe6) == 0xe6;    // + opmask, ZMM
  const bool amx_state = (state & 0x60000) == 0x60000; // XTILECFG, XTILEDATA
  const auto sub0 = cpuid_leaf7(0);
  const auto sub1 = cpuid_leaf7(1);
  caps.avx2 = avx_state && (sub0.ebx & (1u << 5));
  caps.avx512 = avx512_state && (sub0.ebx & (1u << 16)) && // F
                (sub0.ebx & (1u << 17)) &&                 // DQ
                (sub0.ebx & (1u << 30)) &&                 // BW
                (sub0.ebx & (1u << 31));                   // VL
  caps.avx512_bf16 = caps.avx512 && (sub1.eax & (1u << 5));
  caps.avx512_fp16 = caps.avx512 && (sub0.edx & (1u << 23));
  caps.amx_bf16 = amx_state && (sub0.edx & (1u << 22)) && // AMX-BF16
                  (sub0.edx & (1u << 24));                // AMX-TILE
  caps.amx_fp16 =
      amx_state && (sub1.eax & (1u << 21)) && (sub0.edx & (1u << 24));
  caps.source = "CPUID";
  return true;
#else
  (void)caps;
  return false;
#endif
}

} // namespace detail

namespace {

DeviceCapabilities cpu_capabilities() {
  DeviceCapabilities caps;
  caps.type = torch::kCPU;
  caps.name = device_name(torch::Device(torch::kCPU));
  caps.fp16_kernels = fp16_compute_available(torch::Device(torch::kCPU));
  // cpuinfo's names for the flags, in DeviceCapabilities' order.
  std::vector<bool> flags;
  if (detail::libtorch_cpu_flags(
          {"avx2", "avx512_f", "avx512_bw", "avx512_vl", "avx512_dq",
           "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "amx_fp16"},
          flags)) {
    caps.avx2 = flags[0];
    caps.avx512 = flags[1] && flags[2] && flags[3] && flags[4];
    caps.avx512_bf16 = flags[5];
    caps.amx_bf16 = flags[6] && flags[7];
    caps.avx512_fp16 = flags[8];
    caps.amx_fp16 = flags[9] && flags[7];
    caps.source = "LibTorch's CPU capability query";
    return caps;
  }
  if (!detail::read_cpuid(caps)) {
    caps.source = "none (not an x86 CPU; no BF16 or FP16 hardware assumed)";
  }
  return caps;
}

DeviceCapabilities cuda_capabilities(const torch::Device& device) {
  DeviceCapabilities caps;
  caps.type = torch::kCUDA;
  caps.name = device_name(device);
  const auto capability = detail::cuda_compute_capability(device);
  caps.compute_major = capability.first;
  caps.compute_minor = capability.second;
  caps.fp16_kernels = fp16_compute_available(device);
  return caps;
}

} // namespace

DeviceCapabilities device_capabilities(const torch::Device& device) {
  if (device.is_cpu()) {
    // Once per process: the FP16 probe runs kernels. ATen caches the GPU's
    // properties itself.
    static const DeviceCapabilities cpu = cpu_capabilities();
    return cpu;
  }
  if (device.is_cuda()) {
    return cuda_capabilities(device);
  }
  DeviceCapabilities caps;
  caps.type = device.type();
  caps.name = device.str();
  return caps;
}

} // namespace lamp
