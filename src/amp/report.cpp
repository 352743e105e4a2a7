#include "lamp/amp/report.h"

#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

#include "lamp/nn/float8.h"
#include "lamp/nn/norms.h"
#include "lamp/platform/parameters.h"

namespace lamp {
namespace {

bool is_low_precision(torch::Dtype dtype) {
  return dtype == torch::kHalf || dtype == torch::kBFloat16;
}

// The Linear layers of a model with FP8 layers that stay out of FP8, by
// name, with the reason.
using LeftOut = std::map<std::string, std::string>;

// A tensor registered under several names (a tied weight) is reported once,
// under the first. `float8_left_out` is null in a model without FP8 layers.
void collect(const torch::nn::Module& module, const std::string& prefix,
             PrecisionReport& report, detail::TensorIdentitySet& seen,
             const LeftOut* float8_left_out) {
  const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&module);
  const auto add = [&](const std::string& name, const torch::Tensor& t,
                       bool buffer) {
    if (!t.defined() || !seen.insert(t)) {
      return;
    }
    TensorPrecision row;
    row.name = prefix.empty() ? name : prefix + "." + name;
    row.module = module.name();
    row.is_buffer = buffer;
    row.dtype = t.scalar_type();
    row.numel = t.numel();
    row.kept_fp32_reason = lamp::nn::is_norm(module) ? "a norm" : "chosen";
    if (float8_left_out != nullptr && linear != nullptr && name == "weight") {
      row.float8 = lamp::nn::float8_state(*linear) != nullptr;
      const auto found = float8_left_out->find(prefix);
      if (!row.float8 && found != float8_left_out->end()) {
        row.not_float8_reason = found->second;
      }
    }
    report.tensors.push_back(row);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    add(p.key(), p.value(), false);
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    add(b.key(), b.value(), true);
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(),
            prefix.empty() ? child.key() : prefix + "." + child.key(), report,
            seen, float8_left_out);
  }
}

} // namespace

PrecisionReport precision_report(const torch::nn::Module& module) {
  PrecisionReport report;
  detail::TensorIdentitySet seen;
  LeftOut left_out;
  const bool float8 = lamp::nn::has_float8_layers(module);
  if (float8) {
    for (auto& item : lamp::nn::float8_left_out(module)) {
      left_out.insert(std::move(item));
    }
  }
  collect(module, "", report, seen, float8 ? &left_out : nullptr);
  bool any_low = false;
  for (const auto& row : report.tensors) {
    any_low = any_low || is_low_precision(row.dtype);
  }
  for (auto& row : report.tensors) {
    row.kept_fp32 = any_low && row.dtype == torch::kFloat;
    if (!row.kept_fp32) {
      row.kept_fp32_reason.clear();
    }
    report.kept_fp32_tensors += row.kept_fp32;
    report.low_precision_tensors += is_low_precision(row.dtype);
    report.float8_layers += row.float8;
    report.linear_layers_not_float8 += !row.not_float8_reason.empty();
    report.numel_by_dtype[c10::toString(row.dtype)] += row.numel;
  }
  return report;
}

std::string PrecisionReport::to_string() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-40s %-9s %-8s %10s  %s\n", "tensor",
                "dtype", "kind", "elements", "module");
  out << line;
  for (const auto& row : tensors) {
    std::snprintf(line, sizeof(line), "%-40s %-9s %-8s %10lld  ",
                  row.name.c_str(), c10::toString(row.dtype),
                  row.is_buffer ? "buffer" : "param",
                  static_cast<long long>(row.numel));
    // The module and the notes unbounded: a name or a reason never cut.
    out << line << row.module;
    if (row.kept_fp32) {
      out << "  (kept FP32: " << row.kept_fp32_reason << ")";
    }
    if (row.float8) {
      out << "  (FP8 products)";
    } else if (!row.not_float8_reason.empty()) {
      out << "  (not FP8: " << row.not_float8_reason << ")";
    }
    out << "\n";
  }
  out << "totals:";
  for (const auto& item : numel_by_dtype) {
    out << " " << item.first << " " << item.second << " elements;";
  }
  out << " " << low_precision_tensors << " low-precision tensors, "
      << kept_fp32_tensors << " kept in FP32";
  if (float8_layers > 0 || linear_layers_not_float8 > 0) {
    out << "; " << float8_layers << " Linear layers in FP8, "
        << linear_layers_not_float8 << " not";
  }
  out << "\n";
  return out.str();
}

namespace {

// lamp::nn's math attention (LibTorch 1.x): a RecordFunction scope of its
// own, since its matmuls alone would not say they were attention.
constexpr const char* kMathAttentionScope = "lamp::math_attention";

// RecordFunction callbacks are plain function pointers: the counts being
// collected live here, guarded for the autograd engine's threads.
std::mutex op_mutex;
OpPrecisionReport* op_target = nullptr;

bool counted_op(const char* name) {
  // Attention by the kernel that ran: its name is the backend.
  static const char* const ops[] = {
      "aten::convolution", "aten::convolution_backward", "aten::mm",
      "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_flash_attention_backward",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
      "aten::_scaled_dot_product_efficient_attention",
      "aten::_scaled_dot_product_efficient_attention_backward",
      "aten::_scaled_dot_product_cudnn_attention",
      "aten::_scaled_dot_product_cudnn_attention_backward",
      "aten::_scaled_dot_product_attention_math",
      // FP8 products (lamp::nn::float8_linear): counted by their first
      // operand's format, E4M3 forward and E5M2 backward.
      "aten::_scaled_mm", kMathAttentionScope};
  for (const char* op : ops) {
    if (std::strcmp(name, op) == 0)
      return true;
  }
  return false;
}

// Whether autocast has a kernel of its own for the op of `fn` under `key`:
// one that casts the inputs and calls the op again. Every other op falls
// through autocast (its fallback) and computes in the call itself.
bool autocast_wraps(const at::RecordFunction& fn, c10::DispatchKey key) {
  const auto name = fn.operator_name();
  if (!name) {
    return false;
  }
  const auto op = c10::Dispatcher::singleton().findOp(*name);
  return op && op->hasKernelForDispatchKey(key);
}

std::unique_ptr<at::ObserverContext> record_op_dtypes(
    const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr || !counted_op(name)) {
    return nullptr;
  }
  for (const auto& input : fn.inputs()) {
    if (input.isTensor() && input.toTensor().defined()) {
      // Under autocast the ops it wraps (convolution, mm, addmm, ...) are
      // dispatched twice: first with their FP32 inputs into autocast's
      // kernel, which casts them and calls the op again with the autocast
      // key excluded. Count only the call that computes: the one made while
      // the key is excluded (inside autocast's kernel, or with autocast off,
      // which is how ATen switches it off), or, for an op autocast passes
      // through (convolution_backward and attention's backward, in a
      // backward() run inside the autocast guard), its only call.
      const auto& tensor = input.toTensor();
      const auto autocast_key = tensor.is_cuda()
                                    ? c10::DispatchKey::AutocastCUDA
                                    : c10::DispatchKey::AutocastCPU;
      // lamp's own scope is entered once, with the inputs autocast gave it.
      const bool own_scope = std::strcmp(name, kMathAttentionScope) == 0;
      if (!own_scope && (tensor.is_cpu() || tensor.is_cuda()) &&
          !c10::impl::tls_is_dispatch_key_excluded(autocast_key) &&
          autocast_wraps(fn, autocast_key)) {
        return nullptr;
      }
      std::lock_guard<std::mutex> lock(op_mutex);
      if (op_target != nullptr) {
        ++op_target->calls[name][c10::toString(input.toTensor().scalar_type())];
      }
      break;
    }
  }
  return nullptr;
}

} // namespace

int64_t OpPrecisionReport::count(const std::string& op,
                                 torch::Dtype dtype) const {
  const auto by_op = calls.find(op);
  if (by_op == calls.end())
    return 0;
  const auto by_dtype = by_op->second.find(c10::toString(dtype));
  return by_dtype == by_op->second.end() ? 0 : by_dtype->second;
}

int64_t OpPrecisionReport::total(torch::Dtype dtype) const {
  int64_t sum = 0;
  for (const auto& op : calls) {
    sum += count(op.first, dtype);
  }
  return sum;
}

std::string OpPrecisionReport::to_string() const {
  std::ostringstream out;
  for (const auto& op : calls) {
    out << op.first << ":";
    for (const auto& dtype : op.second) {
      out << " " << dtype.first << " " << dtype.second;
    }
    out << "\n";
  }
  return out.str();
}

OpPrecisionReport op_precision_report(const std::function<void()>& fn) {
  OpPrecisionReport report;
  {
    std::lock_guard<std::mutex> lock(op_mutex);
    TORCH_CHECK(
        op_target == nullptr,
        "lamp::op_precision_report: another report is already being collected in this process.");
    op_target = &report;
  }
  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback(record_op_dtypes).needsInputs(true));
  try {
    fn();
  } catch (...) {
    at::removeCallback(handle);
    std::lock_guard<std::mutex> lock(op_mutex);
    op_target = nullptr;
    throw;
  }
  at::removeCallback(handle);
  std::lock_guard<std::mutex> lock(op_mutex);
  op_target = nullptr;
  return report;
}

} // namespace lamp
