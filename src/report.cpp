#include "lamp/report.h"

#include <c10/core/ScalarType.h>

#include <cstdio>
#include <sstream>

namespace lamp {
namespace {

bool is_low_precision(torch::Dtype dtype) {
  return dtype == torch::kHalf || dtype == torch::kBFloat16;
}

void collect(const torch::nn::Module& module, const std::string& prefix,
             PrecisionReport& report) {
  const auto add = [&](const std::string& name, const torch::Tensor& t, bool buffer) {
    if (!t.defined()) {
      return;
    }
    TensorPrecision row;
    row.name = prefix.empty() ? name : prefix + "." + name;
    row.module = module.name();
    row.is_buffer = buffer;
    row.dtype = t.scalar_type();
    row.numel = t.numel();
    report.tensors.push_back(row);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    add(p.key(), p.value(), false);
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    add(b.key(), b.value(), true);
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(), prefix.empty() ? child.key() : prefix + "." + child.key(),
            report);
  }
}

} // namespace

PrecisionReport precision_report(const torch::nn::Module& module) {
  PrecisionReport report;
  collect(module, "", report);
  bool any_low = false;
  for (const auto& row : report.tensors) {
    any_low = any_low || is_low_precision(row.dtype);
  }
  for (auto& row : report.tensors) {
    row.kept_fp32 = any_low && row.dtype == torch::kFloat;
    report.kept_fp32_tensors += row.kept_fp32;
    report.low_precision_tensors += is_low_precision(row.dtype);
    report.numel_by_dtype[c10::toString(row.dtype)] += row.numel;
  }
  return report;
}

std::string PrecisionReport::to_string() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-40s %-9s %-8s %10s  %s\n", "tensor", "dtype",
                "kind", "elements", "module");
  out << line;
  for (const auto& row : tensors) {
    std::snprintf(line, sizeof(line), "%-40s %-9s %-8s %10lld  %s%s\n",
                  row.name.c_str(), c10::toString(row.dtype),
                  row.is_buffer ? "buffer" : "param",
                  static_cast<long long>(row.numel), row.module.c_str(),
                  row.kept_fp32 ? "  (kept FP32)" : "");
    out << line;
  }
  out << "totals:";
  for (const auto& item : numel_by_dtype) {
    out << " " << item.first << " " << item.second << " elements;";
  }
  out << " " << low_precision_tensors << " low-precision tensors, "
      << kept_fp32_tensors << " kept in FP32\n";
  return out.str();
}

} // namespace lamp
