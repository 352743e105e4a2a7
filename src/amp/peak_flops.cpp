// The peak FLOP/s table behind MFU (lamp/amp/peak_flops.h).
#include "lamp/amp/peak_flops.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace lamp {
namespace {

// The words of a device name, upper-cased, split at spaces, '-' and '_':
// "NVIDIA A100-SXM4-80GB" is NVIDIA, A100, SXM4, 80GB. Models are matched
// as whole words: a substring would take "NVIDIA RTX A1000" for an A100.
std::vector<std::string> words_of(const std::string& name) {
  std::vector<std::string> words(1);
  for (const char c : name) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!words.back().empty()) {
        words.emplace_back();
      }
    } else {
      words.back() +=
          static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
  }
  if (words.back().empty()) {
    words.pop_back();
  }
  return words;
}

bool has_word(const std::vector<std::string>& words, const char* word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

bool has_word_starting(const std::vector<std::string>& words,
                       const std::string& prefix) {
  return std::any_of(words.begin(), words.end(), [&](const std::string& w) {
    return w.compare(0, prefix.size(), prefix) == 0;
  });
}

// A GPU's dense peaks in TFLOP/s, from NVIDIA's datasheets.
struct Peaks {
  double fp32, tf32, fp16, bf16;
};

// 0 peaks: not in the table.
Peaks peaks_of(const std::string& name) {
  const auto words = words_of(name);
  // The NVL boards (H100 NVL, H200 NVL) share the SXM parts' chip, not their
  // clocks or peaks: not in the table, rather than given the SXM's.
  // A MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") has a share of the
  // chip's units: the whole chip's peak would understate its MFU.
  if (has_word(words, "NVL") || has_word(words, "MIG")) {
    return {0, 0, 0, 0};
  }
  const Peaks h100_sxm{66.9, 494.7, 989.4, 989.4};
  if (has_word(words, "H200") || has_word(words, "GH200")) {
    return h100_sxm; // H200 SXM and GH200: the H100 SXM5's peaks
  }
  if (has_word(words, "H100")) {
    if (has_word(words, "PCIE")) {
      return {51.2, 378.0, 756.0, 756.0};
    }
    if (has_word(words, "HBM3") || has_word_starting(words, "SXM")) {
      return h100_sxm;
    }
    return {0, 0, 0, 0};
  }
  if (has_word(words, "A100")) {
    return {19.5, 156.0, 312.0, 312.0}; // SXM4 and PCIe alike
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
