#include "kernel_class.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <map>
#include <set>
#include <utility>

namespace lamp_bench {
namespace {

std::string lower(const std::string& text) {
  std::string out = text;
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

bool contains_any(const std::string& text,
                  std::initializer_list<const char*> parts) {
  return std::any_of(parts.begin(), parts.end(),
                     [&](const char* part) { return contains(text, part); });
}

// "aten::add_" -> "add": an ATen op's name without its namespace and its
// in-place underscore; "" for a name that is no ATen op.
std::string aten_base(const std::string& lowered) {
  if (!starts_with(lowered, "aten::")) {
    return "";
  }
  auto base = lowered.substr(6);
  while (!base.empty() && base.back() == '_') {
    base.pop_back();
  }
  return base;
}

// ATen's pointwise ops: one pass over their tensors each.
bool pointwise_op(const std::string& base) {
  // clang-format off
  static const std::set<std::string> ops = {
      "abs", "add", "addcdiv", "addcmul", "clamp", "clamp_max", "clamp_min",
      "div", "exp", "fill", "gelu", "hardtanh", "hardtanh_backward",
      "leaky_relu", "lerp", "maximum", "minimum", "mul", "neg", "reciprocal",
      "relu", "rsqrt", "rsub", "sigmoid", "silu", "sqrt", "sub", "tanh",
      "threshold", "threshold_backward", "where", "zero"};
  // clang-format on
  return ops.count(base) > 0;
}

// Ops that only write their output (no read of it).
bool write_only_op(const std::string& base) {
  return base == "fill" || base == "zero";
}

// ATen's matrix products, and their autograd nodes ("MmBackward0",
// "AddmmBackward0", "BmmBackward0", ...).
bool matmul_op(const std::string& lowered) {
  // clang-format off
  static const std::set<std::string> ops = {
      "_addmm_activation", "_scaled_mm", "addmm", "addmv", "baddbmm", "bmm",
      "dot", "linear", "matmul", "mm", "mv"};
  // clang-format on
  return ops.count(aten_base(lowered)) > 0 ||
         (starts_with(lowered, "autograd::") &&
          contains(lowered, "mmbackward"));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const auto size : shape) {
    n *= size;
  }
  return n;
}

// The rows in table order, with their labels: the one list of both.
const std::vector<std::pair<KernelClass, std::string>>& class_labels() {
  static const std::vector<std::pair<KernelClass, std::string>> labels = {
      {KernelClass::kConvForward, "conv forward"},
      {KernelClass::kConvDgrad, "conv dgrad"},
      {KernelClass::kConvWgrad, "conv wgrad"},
      {KernelClass::kConvBackward, "conv backward"},
      {KernelClass::kConvBatchNorm, "conv+BN folded"},
      {KernelClass::kMatmul, "matmul"},
      {KernelClass::kAttention, "attention"},
      {KernelClass::kBatchNorm, "batchnorm"},
      {KernelClass::kNorm, "other norms"},
      {KernelClass::kSoftmaxLoss, "softmax, loss"},
      {KernelClass::kElementwise, "elementwise"},
      {KernelClass::kOptimizer, "optimizer"},
      {KernelClass::kCopy, "copies"},
      {KernelClass::kOther, "other"}};
  return labels;
}

} // namespace

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

const std::vector<KernelClass>& kernel_classes() {
  static const std::vector<KernelClass> classes = [] {
    std::vector<KernelClass> all;
    for (const auto& entry : class_labels()) {
      all.push_back(entry.first);
    }
    return all;
  }();
  return classes;
}

std::string to_string(KernelClass kernel_class) {
  for (const auto& entry : class_labels()) {
    if (entry.first == kernel_class) {
      return entry.second;
    }
  }
  return "other";
}

KernelClass classify(const std::string& name, StepPhase phase) {
  const auto n = lower(name);
  if (starts_with(n, "lamp::folded_conv")) {
    return KernelClass::kConvBatchNorm;
  }
  if (contains_any(n, {"copy", "memcpy", "memset"}) || n == "aten::to" ||
      n == "aten::clone" || n == "aten::contiguous") {
    return KernelClass::kCopy;
  }
  if (phase == StepPhase::kUpdate) {
    return KernelClass::kOptimizer;
  }
  if (contains_any(n, {"_fused_sgd", "_fused_adam", "fused_sgd", "fusedsgd",
                       "fused_adam", "fusedadam", "multi_tensor_apply",
                       "_foreach_", "aten::_amp_", "amp_update_scale",
                       "amp_non_finite", "unscale"})) {
    return KernelClass::kOptimizer;
  }
  if (contains_any(n,
                   {"attention", "flash_fwd", "flash_bwd", "fmha", "sdpa"})) {
    return KernelClass::kAttention;
  }
  if (contains_any(n, {"batch_norm", "batchnorm", "bn_fw", "bn_bw"})) {
    return KernelClass::kBatchNorm;
  }
  if (contains_any(n, {"layer_norm", "layernorm", "rms_norm", "rmsnorm",
                       "group_norm", "groupnorm", "gammabetabackward"})) {
    return KernelClass::kNorm;
  }
  if (contains(n, "dgrad")) {
    return KernelClass::kConvDgrad;
  }
  if (contains(n, "wgrad")) {
    return KernelClass::kConvWgrad;
  }
  if (contains(n, "fprop")) {
    return KernelClass::kConvForward;
  }
  if (contains_any(n, {"conv1d", "conv2d", "conv3d", "convolution", "convolve",
                       "implicit_gemm", "winograd"})) {
    if (contains(n, "backward")) {
      return KernelClass::kConvBackward;
    }
    if (starts_with(n, "aten::")) {
      return KernelClass::kConvForward; // ATen's backward ops say so
    }
    // A kernel whose name gives no direction: the op that launched it does.
    if (phase == StepPhase::kForward) {
      return KernelClass::kConvForward;
    }
    if (phase == StepPhase::kBackward) {
      return KernelClass::kConvBackward;
    }
    return KernelClass::kOther;
  }
  if (contains_any(n, {"gemm", "gemv", "nvjet", "splitkreduce"}) ||
      matmul_op(n)) {
    return KernelClass::kMatmul;
  }
  if (contains_any(n, {"softmax", "cross_entropy", "nll_loss", "nllloss"})) {
    return KernelClass::kSoftmaxLoss;
  }
  if (contains_any(n, {"elementwise", "vectorized", "unrolled"}) ||
      pointwise_op(aten_base(n))) {
    return KernelClass::kElementwise;
  }
  return KernelClass::kOther;
}

int64_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"double", 8},
      {"float", 4},
      {"c10::Half", 2},
      {"c10::BFloat16", 2},
      {"long int", 8},
      {"long", 8},
      {"int", 4},
      {"short int", 2},
      {"short", 2},
      {"signed char", 1},
      {"unsigned char", 1},
      {"bool", 1},
      {"c10::complex<float>", 8},
      {"c10::complex<double>", 16},
      {"c10::Float8_e4m3fn", 1},
      {"c10::Float8_e5m2", 1}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

int64_t traffic_bytes(const std::string& name,
                      const std::vector<std::vector<int64_t>>& shapes,
                      const std::vector<std::string>& dtypes) {
  const auto n = lower(name);
  const auto base = aten_base(n);
  const bool copy = n == "aten::copy_";
  const bool batch_norm = !base.empty() && contains(base, "batch_norm");
  if (!copy && !batch_norm && !pointwise_op(base)) {
    return -1;
  }
  if (shapes.empty() || shapes.size() != dtypes.size()) {
    return -1;
  }
  int64_t total = 0, largest = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto element = dtype_bytes(dtypes[i]);
    if (element == 0) {
      continue; // a scalar, a list, an undefined optional tensor
    }
    const auto bytes = numel(shapes[i]) * element;
    total += bytes;
    largest = std::max(largest, bytes);
  }
  if (largest == 0) {
    return -1;
  }
  if (copy) {
    return total; // source read, destination written
  }
  return write_only_op(base) ? largest : total + largest;
}

int64_t conv_backward_flops_per_direction(
    const std::vector<std::vector<int64_t>>& shapes) {
  // grad_output [N, O, spatial...], weight [O, C/groups, kernel...]: the
  // forward's multiply-adds are grad_output's elements times a weight
  // filter's.
  if (shapes.size() < 3 || shapes[0].size() < 3 || shapes[2].size() < 3) {
    return -1;
  }
  const auto& weight = shapes[2];
  return 2 * numel(shapes[0]) *
         numel(std::vector<int64_t>(weight.begin() + 1, weight.end()));
}

bool rated_in_flops(KernelClass c) {
  return is_convolution(c) || c == KernelClass::kMatmul;
}

bool is_convolution(KernelClass c) {
  return c == KernelClass::kConvForward || c == KernelClass::kConvDgrad ||
         c == KernelClass::kConvWgrad || c == KernelClass::kConvBackward ||
         c == KernelClass::kConvBatchNorm;
}

} // namespace lamp_bench
