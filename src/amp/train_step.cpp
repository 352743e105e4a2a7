#include "lamp/amp/train_step.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "amp/capture_signature.h"
#include "amp/graph_step.h"
#include "lamp/amp/autocast.h"
#include "lamp/amp/precision_support.h"
#include "lamp/optim/clip.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/out_of_memory.h"
#include "lamp/platform/parameters.h"
#include "platform/number_text.h"

namespace lamp {
namespace {

// What every data-parallel replica's TrainStep must agree on: a difference
// fails inside the backend (accumulation) or trains on silently (the rest).
// The FP8 recipe in words, for the replicas' agreement.
std::string float8_setting(const c10::optional<nn::Float8Recipe>& recipe) {
  if (!recipe) {
    return "off";
  }
  if (recipe->scaling() == nn::Float8Scaling::kCurrent) {
    return "current scaling, margin " + std::to_string(recipe->margin()) +
           (recipe->fused_casts() ? ", fused casts" : "");
  }
  return std::string("delayed scaling, amax history ") +
         std::to_string(recipe->amax_history_len()) + " (" +
         (recipe->amax_compute() == nn::Float8AmaxCompute::kMax
              ? "max"
              : "most recent") +
         "), margin " + std::to_string(recipe->margin()) +
         (recipe->fused_casts() ? ", fused casts" : "");
}

std::vector<std::pair<std::string, std::string>> replica_settings(
    const TrainStepOptions& o) {
  const auto number = [](double value) { return detail::exact(value); };
  const auto flag = [](bool on) { return on ? "true" : "false"; };
  const auto& scaler = o.scaler();
  return {
      {"TrainStepOptions::precision", to_string(o.precision())},
      {"TrainStepOptions::accumulation_steps",
       std::to_string(o.accumulation_steps())},
      {"TrainStepOptions::max_grad_norm", number(o.max_grad_norm())},
      {"TrainStepOptions::skip_non_finite", flag(o.skip_non_finite())},
      {"TrainStepOptions::force_loss_scaling", flag(o.force_loss_scaling())},
      {"TrainStepOptions::flat_master", flag(o.flat_master())},
      {"TrainStepOptions::cuda_graph", to_string(o.cuda_graph())},
      {"TrainStepOptions::float8", float8_setting(o.float8())},
      {"GradScalerOptions::enabled", flag(scaler.enabled())},
      {"GradScalerOptions::dynamic", flag(scaler.dynamic())},
      {"GradScalerOptions::init_scale", number(scaler.init_scale())},
      {"GradScalerOptions::growth_factor", number(scaler.growth_factor())},
      {"GradScalerOptions::backoff_factor", number(scaler.backoff_factor())},
      {"GradScalerOptions::growth_interval",
       std::to_string(scaler.growth_interval())},
      {"GradScalerOptions::hysteresis", std::to_string(scaler.hysteresis())},
      {"GradScalerOptions::min_scale", number(scaler.min_scale())},
      {"GradScalerOptions::max_scale", number(scaler.max_scale())},
      {"GradScalerOptions::min_scale_patience",
       std::to_string(scaler.min_scale_patience())},
  };
}

torch::Device model_device(const torch::nn::Module& model) {
  const auto params = model.parameters();
  TORCH_CHECK(!params.empty(),
              "lamp::TrainStep: the model has no parameters to train.");
  const auto device = params[0].device();
  for (const auto& p : params) {
    TORCH_CHECK(
        p.device() == device,
        "lamp::TrainStep: the model's parameters are on several devices (",
        device, " and ", p.device(),
        "); move the model to one device with model->to(device) first.");
  }
  return device;
}

std::vector<torch::Tensor> optimizer_params(
    torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  return params;
}

// Refuses a mode the device cannot run; warns (once) where it runs slowly
// or as fp32 (precision_warning()).
void check_mode_runs_on(const PrecisionPolicy& policy,
                        const torch::Device& device) {
  if (policy.float8) {
    const auto reason = nn::float8_unavailable_reason(device);
    TORCH_CHECK(reason.empty(),
                "lamp::TrainStep: precision 'fp8' cannot run on ", device, ": ",
                reason, ". Use ", suggest_low_precision(device), ".");
  }
  if (policy.fp16_math) {
    TORCH_CHECK(
        fp16_compute_available(device) &&
            (!policy.autocast_dtype ||
             Autocast::is_supported(device.type(), *policy.autocast_dtype)),
        "lamp::TrainStep: precision '", to_string(policy.precision),
        "' runs FP16 convolutions and matmuls, which this LibTorch cannot run on ",
        device, ". Use ", suggest_low_precision(device),
        device.is_cuda() ? "." : " on the CPU, or train on a CUDA device.");
  }
  warn_precision_once(policy.precision, device);
}

// Refuses an optimizer that holds no parameter, or a trainable tensor
// TrainStep did not hand the factory (`handed`): one built over
// model->parameters() in a mode with FP32 masters steps the 16-bit model
// tensors, which the masters overwrite after every step; it trains nothing,
// without a word. Frozen tensors (requires_grad false) are let through: they
// take no step.
void check_factory_optimizer(const torch::optim::Optimizer& optimizer,
                             const std::vector<torch::Tensor>& handed,
                             bool masters) {
  std::unordered_set<const c10::TensorImpl*> given;
  for (const auto& p : handed) {
    given.insert(p.unsafeGetTensorImpl());
  }
  int64_t held = 0, foreign = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      ++held;
      foreign += p.requires_grad() && given.count(p.unsafeGetTensorImpl()) == 0;
    }
  }
  TORCH_CHECK(held > 0,
              "lamp::TrainStep: the optimizer factory's optimizer holds no "
              "parameters; build it over the parameters TrainStep hands the "
              "factory.");
  TORCH_CHECK(foreign == 0, "lamp::TrainStep: ", foreign, " of the ", held,
              " parameters of the factory's optimizer are not among those "
              "TrainStep handed the factory",
              masters ? " (in this mode, the FP32 master copies)" : "",
              ": build the optimizer over the factory's argument, not "
              "model->parameters(); an optimizer over other tensors trains "
              "nothing.");
}

// The options with precision kAuto resolved for the model's device.
TrainStepOptions with_resolved_precision(
    TrainStepOptions options, const std::shared_ptr<torch::nn::Module>& model) {
  TORCH_CHECK(model != nullptr, "lamp::TrainStep: the model is null.");
  if (options.precision() == Precision::kAuto) {
    options.precision(
        resolve_precision(Precision::kAuto, model_device(*model)));
  }
  return options;
}

GradScalerOptions scaler_options(const TrainStepOptions& options,
                                 const PrecisionPolicy& policy) {
  if (policy.loss_scaling || options.force_loss_scaling()) {
    return options.scaler();
  }
  if (options.skip_non_finite()) {
    return GradScalerOptions(options.scaler())
        .init_scale(1.0)
        .dynamic(false)
        .min_scale(0.0)
        .max_scale(std::numeric_limits<double>::infinity())
        .enabled(true);
  }
  return GradScalerOptions().enabled(false);
}

bool has_parameter_of(const torch::nn::Module& model, torch::Dtype dtype) {
  for (const auto& parameter : model.parameters()) {
    if (parameter.scalar_type() == dtype) {
      return true;
    }
  }
  return false;
}

// The model's floating parameters must be FP32, or already in the dtype the
// mode converts to (a model network_to_half() converted): a low-precision
// model in an FP32-parameter mode would train without master weights, and
// one in the other low-precision dtype would be converted twice.
void check_model_dtype(const torch::nn::Module& model,
                       const PrecisionPolicy& policy) {
  for (const auto& item : model.named_parameters()) {
    const auto dtype = item.value().scalar_type();
    if (!item.value().is_floating_point() || dtype == torch::kFloat ||
        dtype == torch::kDouble ||
        (policy.model_dtype && dtype == *policy.model_dtype)) {
      continue;
    }
    TORCH_CHECK(
        false, "lamp::TrainStep: parameter '", item.key(), "' is ", dtype,
        " but precision '", to_string(policy.precision), "' ",
        policy.model_dtype ? std::string("converts the model to ") +
                                 c10::toString(*policy.model_dtype)
                           : std::string("trains FP32 parameters"),
        "; pass the FP32 model (TrainStep converts it, keeping BatchNorm in FP32), or choose the precision the model was converted for ('half' for Half, 'bf16' for BFloat16).");
  }
}

// The unnamed factory as a named one (null stays null, for the check).
NamedOptimizerFactory ignoring_names(const OptimizerFactory& make_optimizer) {
  if (!make_optimizer) {
    return nullptr;
  }
  return [make_optimizer](const NamedParameters& params) {
    return make_optimizer(params.values());
  };
}

} // namespace

TrainStep::TrainStep(std::shared_ptr<torch::nn::Module> model,
                     const OptimizerFactory& make_optimizer,
                     TrainStepOptions options)
    : TrainStep(std::move(model), ignoring_names(make_optimizer),
                std::move(options)) {}

TrainStep::TrainStep(std::shared_ptr<torch::nn::Module> model,
                     const NamedOptimizerFactory& make_optimizer,
                     TrainStepOptions options)
    : model_(std::move(model)),
      options_(with_resolved_precision(std::move(options), model_)),
      policy_(precision_policy(options_.precision())),
      device_(torch::kCPU),
      scaler_(scaler_options(options_, policy_)),
      unit_scale_(torch::ones({})) {
  TORCH_CHECK(model_ != nullptr, "lamp::TrainStep: the model is null.");
  TORCH_CHECK(make_optimizer != nullptr,
              "lamp::TrainStep: no optimizer factory given.");
  TORCH_CHECK(options_.accumulation_steps() >= 1,
              "lamp::TrainStep: accumulation_steps must be >= 1, got ",
              options_.accumulation_steps(), ".");
  TORCH_CHECK(
      std::isfinite(options_.max_grad_norm()) && options_.max_grad_norm() >= 0,
      "lamp::TrainStep: max_grad_norm must be finite and >= 0 (0 turns clipping off), got ",
      options_.max_grad_norm(), ".");
  device_ = model_device(*model_);
  // Listed once: the step resets their gradients without walking the tree.
  // (Conversion keeps parameter identity, so the list stays valid.) A tied
  // weight is one parameter: listed twice, the optimizer would step it twice.
  model_params_ = unique_parameters(*model_);
  check_mode_runs_on(policy_, device_);
  const auto tf32 = options_.tf32() ? options_.tf32() : policy_.tf32;
  if (device_.is_cuda() && tf32) {
    tf32_ = std::make_unique<Tf32Guard>(*tf32);
  }

  const auto named = unique_named_parameters(*model_);
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : named) {
    if (item.value().requires_grad()) {
      names.push_back(item.key());
      params.push_back(item.value());
    }
  }
  TORCH_CHECK(
      !params.empty(),
      "lamp::TrainStep: the model has no trainable parameters (all ",
      named.size(),
      " have requires_grad=false); set requires_grad_(true) on the ones to train before building the TrainStep.");
  check_model_dtype(*model_, policy_);
  // "fp8" converts with the default recipe (current scaling) unless
  // TrainStepOptions::float8 names one, or the model's owner converted it
  // (a recipe and layers of their own): that conversion is kept.
  auto recipe = options_.float8();
  if (!recipe && policy_.float8 && !nn::has_float8_layers(*model_)) {
    recipe = nn::Float8Recipe();
  }
  if (recipe) {
    float8_conversion_ = nn::convert_to_float8(*model_, *recipe);
    if (float8_conversion_.converted.empty()) {
      std::string why;
      for (const auto& item : float8_conversion_.skipped) {
        why += (why.empty() ? "" : "; ") + std::string("'") + item.first +
               "': " + item.second;
      }
      TORCH_CHECK(
          false, "lamp::TrainStep: ",
          policy_.float8 ? "precision 'fp8'" : "TrainStepOptions::float8",
          " is set but no Linear layer of the model can compute in FP8 (",
          why.empty() ? std::string("it has none") : why, "); use ",
          policy_.float8 ? "precision 'amp-bf16'" : "no float8 recipe",
          " for this model.");
    }
  }
  float8_ = nn::has_float8_layers(*model_);
  const auto dtype = policy_.model_dtype;
  if (dtype) {
    options_.half().dtype(*dtype);
    // A model with parameters in the dtype was converted by its owner
    // (network_to_half, with options of its own: norms or a head kept FP32):
    // converting it again with these options would round what it kept.
    if (!has_parameter_of(*model_, *dtype)) {
      convert_network(*model_, options_.half());
    }
  }
  if (const auto& make_sync = options_.gradient_sync()) {
    // After the conversion, so that replicas synchronise in the dtype they
    // train in; before the master copy, which then starts from rank 0's
    // weights.
    gradient_sync_ = make_sync(model_);
  }
  if (gradient_sync_) {
    gradient_sync_->check_same_settings("the TrainStep options",
                                        replica_settings(options_));
    TORCH_CHECK(gradient_sync_->device() == device_,
                "lamp::TrainStep: the model is on ", device_,
                " but its gradient synchroniser communicates on ",
                gradient_sync_->device(),
                "; build the process group for the model's device.");
    auto* sync = gradient_sync_.get();
    scaler_.set_found_inf_reduction([sync](torch::Tensor& found_inf) {
      sync->reduce_found_inf(found_inf);
    });
  }
  if (gradient_sync_) {
    sharding_ = gradient_sync_->optimizer_sharding();
  }
  if (dtype && !sharding_) {
    // Sharded, the FP32 masters are the shards (each rank keeps 1/N).
    master_ = std::make_unique<MasterWeights>(params, options_.flat_master());
    master_->set_parameter_names(names);
    params = master_->master_params();
  }
  NamedParameters named_params;
  for (size_t i = 0; i < params.size(); ++i) {
    named_params.insert(names[i], params[i]);
  }
  optimizer_ = make_optimizer(named_params);
  TORCH_CHECK(optimizer_ != nullptr,
              "lamp::TrainStep: the optimizer factory returned null.");
  check_factory_optimizer(*optimizer_, params, master_ != nullptr);
  if (sharding_) {
    // The optimizer's param groups, built over the model's parameters, now
    // step this rank's FP32 shards of them.
    sharding_->shard(*optimizer_, params, names);
    params = sharding_->shards();
    names = sharding_->shard_names();
  }
  scaler_.set_parameter_names(names, params);
  for (size_t i = 0; i < params.size(); ++i) {
    param_names_.emplace(params[i].unsafeGetTensorImpl(), names[i]);
  }
  graph_enabled_ = options_.cuda_graph() == CudaGraphMode::kOn ||
                   (options_.cuda_graph() == CudaGraphMode::kAuto &&
                    cuda_graph_unavailable_reason().empty());
}

TrainStep::~TrainStep() = default;
TrainStep::TrainStep(TrainStep&& other) = default;

torch::Tensor TrainStep::cast_input(const torch::Tensor& input) const {
  const auto& dtype = policy_.model_dtype;
  if (!dtype || !input.is_floating_point()) {
    return input;
  }
  return input.to(*dtype);
}

torch::Tensor TrainStep::forward(
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const torch::Tensor& input) const {
  TORCH_CHECK(forward != nullptr,
              "lamp::TrainStep::forward: no forward function given.");
  c10::optional<Autocast> autocast;
  if (const auto& dtype = policy_.autocast_dtype) {
    autocast.emplace(device_.type(), *dtype);
  }
  return forward(cast_input(input));
}

namespace {
constexpr const char* kStepCaller = "lamp::TrainStep::step";
// An allocation that fails inside a step (activations, gradients, optimizer
// state, graph pools) is reported as the step's.
constexpr const char* kStepMemory =
    "the activations, gradients and optimizer state of a training step";

// A closure that feeds the 16-bit model an FP32 input (cast_input()
// forgotten) fails inside LibTorch with words that name neither TrainStep
// nor the fix ("mat1 and mat2 must have the same dtype", "Input type (float)
// and bias type (c10::BFloat16) should be the same", 1.13's "expected scalar
// type BFloat16 but found Float"). Such an error keeps its words and gains
// the fix: an operands' mismatch, or a dtype error that names the model's
// 16-bit type. Any other error passes through as it came (a loss's target of
// the wrong type, "expected scalar type Long but found Float", names no
// 16-bit type).
[[noreturn]] void rethrow_with_cast_hint(
    const c10::Error& error, const c10::optional<torch::Dtype>& model_dtype) {
  if (!model_dtype) {
    throw;
  }
  const std::string message = error.what_without_backtrace();
  const auto says = [&](const char* words) {
    return message.find(words) != std::string::npos;
  };
  const bool operands_differ =
      says("must have the same dtype") || says("should be the same");
  const bool names_model_dtype = (says("dtype") || says("scalar type")) &&
                                 says(c10::toString(*model_dtype));
  if (!operands_differ && !names_model_dtype) {
    throw;
  }
  TORCH_CHECK(false, "lamp::TrainStep::step: loss_fn failed: ", message,
              "\nThe model's floating-point weights are ", *model_dtype,
              " in this mode: pass each input through step.cast_input(x) "
              "inside loss_fn, or call step.step(input, target, loss), "
              "which casts it.");
}
} // namespace

StepResult TrainStep::step(const std::function<torch::Tensor()>& loss_fn) {
  TORCH_CHECK(loss_fn != nullptr,
              "lamp::TrainStep::step: no loss closure given.");
  detail::InUseGuard in_use(in_use_, kStepCaller);
  return with_memory_context(kStepMemory, -1,
                             [&] { return eager_step(loss_fn); });
}

StepResult TrainStep::eager_step(
    const std::function<torch::Tensor()>& loss_fn) {
  try {
    return eager_step_once(loss_fn);
  } catch (...) {
    discard_cycle();
    throw;
  }
}

void TrainStep::discard_cycle() noexcept {
  // The next step starts a cycle afresh: it clears the gradients this one
  // left half summed (or scaled).
  micro_step_ = 0;
  if (graphs_ && graphs_->capturing()) {
    return; // a failed capture is the graph's to undo, and reads nothing
  }
  try {
    // The scaler forgets this step's unscale and overflow check, which the
    // next step makes again; without this it would skip its own unscale and
    // step on gradients still multiplied by the scale. The scale stays.
    if (scaler_.is_enabled()) {
      scaler_.update(scaler_.get_scale());
    }
    // An optimizer that threw inside its step may have moved some masters:
    // the model follows them, as a finished step's would.
    if (master_) {
      master_->master_params_to_model_params();
    }
  } catch (...) {
    // The step's own error is the one to report; a scaler never used has
    // nothing to forget.
  }
}

StepResult TrainStep::eager_step_once(
    const std::function<torch::Tensor()>& loss_fn) {
  if (micro_step_ == 0) {
    for (auto& p : model_params_) {
      p.mutable_grad() = torch::Tensor();
    }
  }
  torch::Tensor loss;
  {
    if (gradient_sync_) {
      gradient_sync_->before_forward();
    }
    c10::optional<Autocast> autocast;
    if (const auto& dtype = policy_.autocast_dtype) {
      // A captured step cannot use autocast's cast cache: its FP16 weight
      // copies would be made once, at capture, and never again.
      autocast.emplace(
          device_.type(), *dtype, /*enabled=*/true,
          graph_enabled_ ? c10::optional<bool>(false) : c10::nullopt);
    }
    try {
      loss = loss_fn();
    } catch (const c10::Error& e) {
      rethrow_with_cast_hint(e, policy_.model_dtype);
    }
  }
  TORCH_CHECK(
      loss.defined() && loss.numel() == 1,
      "lamp::TrainStep::step: loss_fn must return a one-element loss tensor, got ",
      (loss.defined() ? loss.sizes() : at::IntArrayRef{}), ".");
  // Autograd's own word for these ("element 0 of tensors does not require
  // grad") names neither the loss nor the cause.
  TORCH_CHECK(loss.requires_grad(),
              "lamp::TrainStep::step: the loss loss_fn returned has no "
              "gradient to take (a ",
              loss.scalar_type(),
              " tensor that does not require grad): compute it from the "
              "model's output, not detached, not under a NoGradGuard, and "
              "in a floating-point type.");
  const auto accumulation = options_.accumulation_steps();
  if (gradient_sync_) {
    // Only the backward that ends an accumulation cycle communicates.
    gradient_sync_->set_sync(micro_step_ + 1 == accumulation);
  }
  scaler_
      .scale(accumulation > 1 ? loss / static_cast<double>(accumulation) : loss)
      .backward();

  StepResult result;
  result.loss = loss.detach();
  if (++micro_step_ < accumulation) {
    result.scale = current_scale();
    return result;
  }
  micro_step_ = 0;
  if (gradient_sync_) {
    gradient_sync_->finish_gradient_sync();
  }
  // Its host read waits for an eager step (never inside a CUDA graph's
  // capture).
  if (float8_ && !float8_use_checked_ && !(graphs_ && graphs_->capturing())) {
    warn_unused_float8_layers();
  }
  if (float8_) {
    // The backward recorded dY's amaxes: every operand's amax of the cycle
    // is in, agreed over the replicas.
    if (gradient_sync_) {
      auto* sync = gradient_sync_.get();
      nn::update_float8_scales(
          *model_, [sync](torch::Tensor& amax) { sync->reduce_max_(amax); });
    } else {
      nn::update_float8_scales(*model_);
    }
  }
  if (master_) {
    master_->model_grads_to_master_grads();
  }
  if (sharding_) {
    sharding_->gradients_to_shards();
  }
  if (options_.max_grad_norm() > 0) {
    // Sharded, the unscale's overflow flag is combined over the ranks (the
    // GradientSync's reduction), and so is the norm.
    scaler_.unscale_(*optimizer_);
    std::function<void(torch::Tensor&)> reduce_square_sum;
    if (sharding_) {
      auto* sharding = sharding_.get();
      reduce_square_sum = [sharding](torch::Tensor& square_sum) {
        sharding->reduce_square_sum(square_sum);
      };
    }
    // lamp's clip keeps the norm on the device (LibTorch's returns a double).
    result.grad_norm =
        optim::clip_grad_norm_(optimizer_params(*optimizer_),
                               options_.max_grad_norm(), reduce_square_sum);
  }
  if (!graphs_ || !graphs_->capturing()) {
    // Eager steps read the device learning rates too (set for CUDA graphs):
    // bring them up to the param groups' values. A capture must not: the
    // fill would be recorded with today's value and replayed forever.
    if (auto* on_device = dynamic_cast<optim::AmpStep*>(optimizer_.get());
        on_device != nullptr && on_device->device_lr()) {
      on_device->refresh_device_lr();
    }
  }
  result.found_inf = scaler_.step_async(*optimizer_);
  scaler_.update();
  if (master_) {
    // A skipped step left the masters as they were: copying them again is
    // harmless, and needs no host read of the overflow flag.
    master_->master_params_to_model_params();
  }
  if (sharding_) {
    // Likewise every rank's shards into the parameters.
    sharding_->shards_to_parameters();
  }
  result.cycle_ended = true;
  result.scale = current_scale();
  return result;
}

StepResult TrainStep::step(const torch::Tensor& input,
                           const torch::Tensor& target,
                           const BatchLossFn& loss_fn) {
  TORCH_CHECK(loss_fn != nullptr,
              "lamp::TrainStep::step: no loss function given.");
  detail::InUseGuard in_use(in_use_, kStepCaller);
  return with_memory_context(
      kStepMemory, -1, [&] { return batch_step(input, target, loss_fn); });
}

void TrainStep::warn_unused_float8_layers() {
  // Once, after the first cycle (one host read): a converted layer the
  // model applies with Linear::forward instead of lamp::nn::linear never
  // computes in FP8, which nothing else would show.
  float8_use_checked_ = true;
  std::string unused;
  for (const auto& stats : nn::float8_stats(*model_)) {
    if (stats.casts[0] == 0) {
      unused += (unused.empty() ? "'" : ", '") + stats.name + "'";
    }
  }
  if (!unused.empty()) {
    TORCH_WARN("lamp::TrainStep: the FP8 layer(s) ", unused,
               " took no FP8 product in the first step: the model applies "
               "them with Linear::forward (or not at all), which computes in "
               "BF16. Apply them with lamp::nn::linear(x, layer) to train "
               "them in FP8.");
  }
}

torch::Tensor TrainStep::current_scale() const {
  // A copy: the scaler updates its own tensor in place on later steps.
  return scaler_.is_enabled() ? scaler_.scale_tensor().clone() : unit_scale_;
}

} // namespace lamp
