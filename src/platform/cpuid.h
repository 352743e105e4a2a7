#pragma once

// lamp's own reading of the x86 CPU's BF16/FP16 instruction sets (CPUID leaf
// 7 and XCR0), behind DeviceCapabilities where LibTorch has no CPU
// capability query (LibTorch 1.13). Declared here so that the tests can
// check it on any LibTorch.

#include "lamp/platform/hardware.h"

namespace lamp::detail {

// Fills caps' instruction-set flags (avx2, avx512, avx512_bf16, avx512_fp16,
// amx_bf16, amx_fp16) from CPUID and sets caps.source to "CPUID"; returns
// true. On a CPU that is not x86 it changes nothing and returns false.
bool read_cpuid(DeviceCapabilities& caps);

} // namespace lamp::detail
