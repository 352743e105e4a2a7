// The peak FLOP/s table behind MFU (lamp/amp/peak_flops.h).
#include "lamp/amp/peak_flops.h"

namespace lamp {
namespace {

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

// A GPU's dense peaks in TFLOP/s, from NVIDIA's datasheets.
struct Peaks {
  double fp32, tf32, fp16, bf16;
};

// 0 peaks: not in the table.
Peaks peaks_of(const std::string& name) {
  if (contains(name, "H200") ||
      (contains(name, "H100") &&
       (contains(name, "HBM3") || contains(name, "SXM")))) {
    return {66.9, 494.7, 989.4, 989.4}; // H100 SXM5; H200 and GH200 alike
  }
  if (contains(name, "H100") && contains(name, "PCIe")) {
    return {51.2, 378.0, 756.0, 756.0};
  }
  if (contains(name, "A100")) {
    return {19.5, 156.0, 312.0, 312.0};
  }
  return {0, 0, 0, 0};
}

} // namespace

double peak_flops(const std::string& device_name, Precision precision) {
  const auto p = peaks_of(device_name);
  double tflops = 0;
  switch (precision) {
    case Precision::kFP32:
      tflops = p.fp32;
      break;
    case Precision::kTF32:
      tflops = p.tf32;
      break;
    case Precision::kAMP:
    case Precision::kHalf:
      tflops = p.fp16;
      break;
    case Precision::kAMPBF16:
    case Precision::kBF16:
    case Precision::kFP8:
      tflops = p.bf16;
      break;
    case Precision::kAuto:
      tflops = 0;
      break;
  }
  return tflops * 1e12;
}

} // namespace lamp
