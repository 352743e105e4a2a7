#include "lamp/amp/numerics_check.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "platform/number_text.h"

namespace lamp {
namespace {

constexpr double kFp16Max = 65504.0;

struct ModuleInfo {
  std::string path;
  std::string type;
};

// One checked tensor: an op's output or a gradient, with its largest
// magnitude still on the device.
struct Record {
  bool backward = false;
  int module = -1; // index into Observation::modules; -1: before any module
  bool in_module = false;
  std::string op;
  torch::ScalarType dtype = torch::kFloat;
  torch::Tensor max_abs; // 0-dim FP64
  std::string parameter; // a parameter's gradient: the parameter's name
};

// The sequence numbers of the autograd nodes a forward op made.
struct ForwardRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  int module = -1;
  bool in_module = false;
};

// What one observe() collects. RecordFunction callbacks are plain function
// pointers, so the observation being collected is reached through `active`,
// guarded for autograd's worker threads.
struct Observation {
  std::vector<ModuleInfo> modules;
  std::vector<std::shared_ptr<torch::nn::Module>> module_ptrs;
  std::unordered_map<const c10::TensorImpl*, int> owner;
  std::vector<Record> records;
  std::vector<ForwardRange> ranges;
  // Tensors made from parameters alone (a transpose, a cast), kept alive so
  // that their addresses stay theirs while they belong to `owner`.
  std::vector<torch::Tensor> derived;
  int last_forward_module = -1;
};

std::mutex observe_mutex;
Observation* active = nullptr;

// The observers' own bookkeeping per thread: the depth of nested ops (only
// the outermost are checked) and, in backward, the module of the node that
// ran last (a parameter's gradient follows the node that produced it).
thread_local int op_depth = 0;
thread_local int last_backward_module = -1;
thread_local bool last_backward_in_module = false;

struct OpContext : at::ObserverContext {
  int module = -1;
  bool in_module = false;
  // Every tensor input is a parameter or buffer (or made from them): the
  // output is the module's weight in another form, not its output.
  bool derived = false;
  uint64_t seq_begin = 0;
};

// The largest magnitude of `t` as a 0-dim FP64 tensor (NaN where it holds
// one), or undefined for tensors that are not checked. FP64, not FP32: a
// finite double beyond FP32's range must not read as inf.
torch::Tensor max_abs_of(const torch::Tensor& t) {
  if (!t.defined() || !t.is_floating_point() || t.numel() == 0 ||
      t.layout() != torch::kStrided) {
    return {};
  }
  // max() propagates NaN; a reduction in the tensor's dtype is exact.
  return t.detach().abs().max().to(torch::kDouble);
}

// Calls `f` on each defined tensor of `value`: the tensor itself, or the
// elements of a list. Ops take and return lists too: an RNN passes all its
// weights to aten::lstm, aten::gru or aten::rnn_tanh as one Tensor[], and
// chunk() or unbind() return their pieces as one.
template <typename F>
void for_each_tensor(const c10::IValue& value, const F& f) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) {
      f(value.toTensor());
    }
  } else if (value.isList()) {
    for (const auto& element : value.toListRef()) {
      if (element.isTensor() && element.toTensor().defined()) {
        f(element.toTensor());
      }
    }
  }
}

// Records the tensors of `value`; in forward only those autograd tracks (the
// model's activations, not the gradients zero_grad() resets in grad mode).
void add_records(Observation& obs, const c10::IValue& value, bool backward,
                 int module, bool in_module, const std::string& op) {
  const auto add = [&](const torch::Tensor& t) {
    if (!backward && !(t.defined() && t.requires_grad())) {
      return;
    }
    auto m = max_abs_of(t);
    if (m.defined()) {
      obs.records.push_back({backward, module, in_module, op, t.scalar_type(),
                             std::move(m),
                             /*parameter=*/""});
    }
  };
  for_each_tensor(value, add);
}

// The module whose parameter or buffer is among `inputs`, alone or in a
// list (or -1), and whether every tensor input is one.
std::pair<int, bool> owner_of(const Observation& obs,
                              c10::ArrayRef<const c10::IValue> inputs) {
  int owner = -1;
  bool all = true;
  for (const auto& input : inputs) {
    for_each_tensor(input, [&](const torch::Tensor& t) {
      const auto found = obs.owner.find(t.unsafeGetTensorImpl());
      if (found == obs.owner.end()) {
        all = false;
      } else if (owner < 0) {
        owner = found->second;
      }
    });
  }
  return {owner, owner >= 0 && all};
}

void on_backward_node(Observation& obs, const at::RecordFunction& fn) {
  const uint64_t seq = static_cast<uint64_t>(fn.seqNr());
  int module = last_backward_module;
  bool in_module = last_backward_in_module;
  // AccumulateGrad has no forward op (its sequence number is the largest):
  // it takes the gradient of a parameter of the node that ran before it.
  const auto& ranges = obs.ranges;
  const auto after = std::upper_bound(
      ranges.begin(), ranges.end(), seq,
      [](uint64_t s, const ForwardRange& r) { return s < r.begin; });
  if (fn.seqNr() >= 0 && after != ranges.begin()) {
    const auto& range = *(after - 1);
    module = range.module;
    in_module = range.in_module && seq < range.end;
    last_backward_module = module;
    last_backward_in_module = in_module;
  }
  for (const auto& input : fn.inputs()) {
    add_records(obs, input, /*backward=*/true, module, in_module, fn.name());
  }
}

std::unique_ptr<at::ObserverContext> check_op_inputs(
    const at::RecordFunction& fn) {
  // The engine runs each autograd node inside an op of its own
  // ("autograd::engine::evaluate_function: ..."): nodes are taken at any
  // depth, forward ops only outermost.
  const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  if (++op_depth != 1 && !node) {
    return nullptr;
  }
  // Forward ops run with grad mode on (the optimizer's run under no_grad).
  if (!node && !at::GradMode::is_enabled()) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(observe_mutex);
  if (active == nullptr) {
    return nullptr;
  }
  // The observers' own reductions are neither observed nor recorded by
  // autograd.
  at::DisableRecordFunctionGuard no_observers;
  torch::NoGradGuard no_grad;
  if (node) {
    on_backward_node(*active, fn);
    return nullptr;
  }
  auto context = std::make_unique<OpContext>();
  const auto found = owner_of(*active, fn.inputs());
  const int owner = found.first;
  context->derived = found.second;
  context->in_module = owner >= 0;
  if (owner >= 0 && !context->derived && active->last_forward_module < 0) {
    // The first module's op: its other inputs are the model's input.
    for (const auto& input : fn.inputs()) {
      for_each_tensor(input, [&](const torch::Tensor& t) {
        if (active->owner.count(t.unsafeGetTensorImpl()) != 0) {
          return;
        }
        auto m = max_abs_of(t);
        if (m.defined()) {
          active->records.push_back({false, -1, false,
                                     std::string("input of ") + fn.name(),
                                     t.scalar_type(), std::move(m),
                                     /*parameter=*/""});
        }
      });
    }
  }
  context->module = owner >= 0 ? owner : active->last_forward_module;
  if (!context->derived) {
    active->last_forward_module = context->module;
  }
  context->seq_begin = at::sequence_number::peek();
  return context;
}

void check_op_outputs(const at::RecordFunction& fn,
                      at::ObserverContext* context) {
  --op_depth;
  if (context == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> lock(observe_mutex);
  if (active == nullptr) {
    return;
  }
  at::DisableRecordFunctionGuard no_observers;
  torch::NoGradGuard no_grad;
  const auto& op = *static_cast<OpContext*>(context);
  const uint64_t seq_end = at::sequence_number::peek();
  if (seq_end > op.seq_begin) {
    active->ranges.push_back({op.seq_begin, seq_end, op.module, op.in_module});
  }
  for (const auto& output : fn.outputs()) {
    if (op.derived) {
      for_each_tensor(output, [&](const torch::Tensor& t) {
        active->owner.emplace(t.unsafeGetTensorImpl(), op.module);
        active->derived.push_back(t);
      });
    } else {
      add_records(*active, output, /*backward=*/false, op.module, op.in_module,
                  fn.name());
    }
  }
}

void build_module_map(torch::nn::Module& model, Observation& obs) {
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const int index = static_cast<int>(obs.modules.size());
    const auto& module = *item.value();
    obs.modules.push_back({item.key(), module.name()});
    obs.module_ptrs.push_back(item.value());
    for (const auto& p : module.named_parameters(/*recurse=*/false)) {
      obs.owner.emplace(p.value().unsafeGetTensorImpl(), index);
    }
    for (const auto& b : module.named_buffers(/*recurse=*/false)) {
      if (b.value().defined()) {
        obs.owner.emplace(b.value().unsafeGetTensorImpl(), index);
      }
    }
  }
}

// The largest magnitudes of `records`, read to the host at once per device.
std::vector<double> read_max_abs(const std::vector<Record>& records) {
  std::vector<double> values(records.size());
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < records.size(); ++i) {
    by_device[records[i].max_abs.device().str()].push_back(i);
  }
  for (const auto& group : by_device) {
    std::vector<torch::Tensor> parts;
    parts.reserve(group.second.size());
    for (size_t i : group.second) {
      parts.push_back(records[i].max_abs);
    }
    const auto host = torch::stack(parts).to(torch::kCPU).contiguous();
    const double* data = host.data_ptr<double>();
    for (size_t j = 0; j < group.second.size(); ++j) {
      values[group.second[j]] = data[j];
    }
  }
  return values;
}

} // namespace

std::string NumericsFinding::to_string() const {
  std::ostringstream out;
  out << "step " << step << ", " << (backward ? "backward" : "forward") << ": ";
  const bool parameter_gradient =
      backward &&
      (!parameter.empty() || op.find("AccumulateGrad") != std::string::npos);
  const std::string what = parameter_gradient ? "the gradient of the parameters"
                           : backward         ? "the gradient of the output"
                                              : "the output";
  const std::string name =
      module.empty() ? "the model itself" : "module '" + module + "'";
  if (!parameter.empty()) {
    out << "the gradient of parameter '"
        << (module.empty() ? parameter : module + "." + parameter) << "' ("
        << module_type << ")";
  } else if (module_type.empty() && backward) {
    out << "the gradient at " << op
        << " (an op whose forward ran before the observation)";
  } else if (module_type.empty()) {
    out << "the " << op
        << " (the model's input, before any module with parameters)";
  } else if (in_module) {
    out << what << " of " << name << " (" << module_type << ", op " << op
        << ")";
  } else {
    out << what << " of " << op << ", a parameter-free op after " << name
        << " (" << module_type << "),";
  }
  out << " holds "
      << (non_finite ? "inf/NaN"
                     : "FP16 values at the edge of its range (65504)")
      << " (largest magnitude "
      << (std::isnan(max_abs)   ? std::string("nan")
          : std::isinf(max_abs) ? std::string("inf")
                                : detail::exact(max_abs))
      << ", " << c10::toString(dtype) << ")";
  return out.str();
}

std::string NumericsCheck::message(const NumericsFinding& finding) {
  std::string fix;
  if (finding.dtype == torch::kHalf) {
    fix =
        "FP16 holds magnitudes up to 65504: train in BF16 (lamp::Precision::kAMPBF16; the programs' --precision amp-bf16), which has FP32's range, or lower the learning rate and clip the gradients (TrainStepOptions::max_grad_norm; --max-grad-norm).";
  } else if (finding.backward) {
    fix =
        "Clip the gradients (TrainStepOptions::max_grad_norm; --max-grad-norm) or lower the learning rate.";
  } else {
    fix =
        "Lower the learning rate or clip the gradients (TrainStepOptions::max_grad_norm; --max-grad-norm); if it is the first step, check the input data and the weights' initialisation for inf/NaN.";
  }
  return "lamp::NumericsCheck: " + finding.to_string() + ". " + fix;
}

NumericsCheck::NumericsCheck(std::shared_ptr<torch::nn::Module> model,
                             NumericsCheckOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  TORCH_CHECK(model_ != nullptr, "lamp::NumericsCheck: the model is null.");
  TORCH_CHECK(
      options_.fp16_range_fraction() > 0 && options_.fp16_range_fraction() <= 1,
      "lamp::NumericsCheck: fp16_range_fraction must be in (0, 1], got ",
      options_.fp16_range_fraction(), ".");
}

c10::optional<NumericsFinding> NumericsCheck::observe(
    int64_t step, const std::function<void()>& fn, bool loss_scaled) {
  Observation obs;
  build_module_map(*model_, obs);
  {
    std::lock_guard<std::mutex> lock(observe_mutex);
    TORCH_CHECK(
        active == nullptr,
        "lamp::NumericsCheck::observe: another step is being observed in this process; observe one at a time.");
    active = &obs;
  }
  last_backward_module = -1;
  last_backward_in_module = false;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(check_op_inputs, check_op_outputs)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes(
              {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  const auto stop_observing = [&] {
    at::removeCallback(handle);
    std::lock_guard<std::mutex> lock(observe_mutex);
    active = nullptr;
  };
  try {
    fn();
  } catch (...) {
    stop_observing();
    throw;
  }
  stop_observing();
  if (options_.backward()) {
    // The parameters' gradients as the step left them, last module first
    // (backward's order): what hooks on them made, which the engine's
    // observers cannot see in every LibTorch version.
    for (int index = static_cast<int>(obs.modules.size()) - 1; index >= 0;
         --index) {
      const auto& module = *obs.module_ptrs[index];
      for (const auto& p : module.named_parameters(/*recurse=*/false)) {
        auto m = max_abs_of(p.value().grad());
        if (m.defined()) {
          obs.records.push_back({true, index, true, "",
                                 p.value().grad().scalar_type(), std::move(m),
                                 p.key()});
        }
      }
    }
  }

  const auto values = read_max_abs(obs.records);
  const double edge = options_.fp16_range_fraction() * kFp16Max;
  for (size_t i = 0; i < obs.records.size(); ++i) {
    const auto& record = obs.records[i];
    if (!(record.backward ? options_.backward() : options_.forward())) {
      continue;
    }
    const bool scaled = record.backward && loss_scaled;
    const double value = values[i];
    const bool non_finite = !std::isfinite(value);
    const bool at_edge =
        record.dtype == torch::kHalf && value > edge && !scaled;
    if (!non_finite && !at_edge) {
      continue;
    }
    NumericsFinding finding;
    finding.step = step;
    finding.backward = record.backward;
    if (record.module >= 0) {
      finding.module = obs.modules[record.module].path;
      finding.module_type = obs.modules[record.module].type;
    }
    finding.in_module = record.in_module;
    finding.op = record.op;
    finding.parameter = record.parameter;
    finding.dtype = record.dtype;
    finding.max_abs = value;
    finding.non_finite = non_finite;
    finding.loss_scaled = scaled;
    TORCH_CHECK(!(options_.stop() && finding.stops()), message(finding));
    return finding;
  }
  return c10::nullopt;
}

} // namespace lamp
