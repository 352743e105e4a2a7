#pragma once

/// \file
/// One object that turns a model, an optimizer and a precision mode into a
/// correct mixed-precision training step.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/gradient_sync.h"
#include "lamp/amp/half.h"
#include "lamp/amp/master_weights.h"
#include "lamp/amp/optimizer_sharding.h"
#include "lamp/amp/precision.h"
#include "lamp/nn/float8.h"
#include "lamp/platform/in_use.h"
#include "lamp/platform/names.h"

namespace lamp {

class Tf32Guard;

namespace detail {
class CaptureSignature;
class GraphStep;
} // namespace detail

/// Whether TrainStep's batch form of step() runs as CUDA graphs.
enum class CudaGraphMode {
  /// Eager steps.
  kOff,
  /// CUDA graphs; a step that cannot be captured is refused with the reason.
  kOn,
  /// CUDA graphs where they apply (TrainStep::cuda_graph_unavailable_reason()
  /// is empty), eager steps otherwise.
  kAuto,
};

/// The spellings of the CUDA-graph modes: "auto", "on", "off".
const NameTable<CudaGraphMode>& cuda_graph_mode_table();
/// "off", "on" or "auto".
std::string to_string(CudaGraphMode mode);
/// Parses "off", "on" or "auto"; anything else is refused with the list.
CudaGraphMode parse_cuda_graph_mode(const std::string& name);

/// Options of TrainStep.
struct TrainStepOptions {
  /// Options for `precision`, every other field at its default; implicit,
  /// so that a precision converts to options.
  /* implicit */ TrainStepOptions(Precision precision = Precision::kFP32)
      : precision_(precision) {}

  /// The precision mode (see lamp::Precision). kAuto is resolved for the
  /// model's device when the TrainStep is built (resolve_precision());
  /// TrainStep::options() and policy() then hold the mode it chose. A mode
  /// that is emulated on the device, or that computes as fp32 there ("tf32"
  /// on a CPU), warns once per process (warn_precision_once()).
  TORCH_ARG(Precision, precision);
  /// Micro-batches whose gradients are summed before one optimizer step; each
  /// micro-batch's loss is divided by this.
  TORCH_ARG(int64_t, accumulation_steps) = 1;
  /// Clip the global L2 norm of the (unscaled) gradients to this; 0 = off.
  /// Each step reports the norm before clipping (StepResult::grad_norm)
  /// while clipping is on.
  TORCH_ARG(double, max_grad_norm) = 0.0;
  /// The loss scaler's options, used by the FP16 modes ("amp", "half"); the
  /// BF16 and FP32 modes run with a disabled scaler unless
  /// `force_loss_scaling` is set.
  TORCH_ARG(GradScalerOptions, scaler) = {};
  /// Scale the loss with `scaler()`'s options in every mode, also in those
  /// whose range does not need it ("fp32", "tf32", "amp-bf16", "bf16"). E.g.
  /// to reproduce an FP16 run's scale schedule in BF16, or to test the
  /// scaling path on a CPU without FP16 kernels. Takes precedence over
  /// `skip_non_finite`.
  TORCH_ARG(bool, force_loss_scaling) = false;
  /// Conversion options of the "half"/"bf16" modes; the dtype comes from the
  /// precision. Unused for a model that has parameters in that dtype
  /// already (converted by its owner, with the options the owner chose).
  TORCH_ARG(HalfOptions, half) = {};
  /// In the modes without loss scaling ("fp32", "tf32", "amp-bf16", "bf16"),
  /// still check the gradients and skip optimizer steps with inf/NaN (a
  /// static scaler at scale 1): a NaN batch leaves the weights as they were
  /// and the step counts as skipped (StepResult::skipped(),
  /// GradScaler::steps_skipped()), as in the FP16 modes. The check is one
  /// multi-tensor kernel over the gradients; with lamp::optim's fused
  /// optimizers the skip stays on the device (no host sync, CUDA graphs
  /// included), with other optimizers the step reads the flag on the host.
  /// On by default since lamp 0.4; false steps with whatever the gradients
  /// hold (lamp 0.3's behaviour).
  TORCH_ARG(bool, skip_non_finite) = true;
  /// Keep the master weights in one flat buffer ("half"/"bf16").
  TORCH_ARG(bool, flat_master) = false;
  /// TF32 for FP32 convolutions and matmuls on CUDA while this TrainStep
  /// exists. Unset: from the precision ("fp32" off, "tf32" on, the other
  /// modes leave it as it is). The setting is LibTorch's, for the whole
  /// process; the TrainStep restores the one it found when it is destroyed
  /// (lamp::Tf32Guard). No effect on CPU models.
  TORCH_ARG(c10::optional<bool>, tf32) = c10::nullopt;
  /// Data-parallel training: builds the GradientSync that keeps this
  /// replica's gradients equal to the others' (lamp/amp/gradient_sync.h).
  /// For a process group:
  /// `gradient_sync(lamp::distributed::data_parallel(group))` (see
  /// lamp/distributed/data_parallel.h): rank 0's weights are broadcast at
  /// construction, gradients are averaged over the ranks in buckets during
  /// backward, and the scaler's overflow flags are combined so that every
  /// rank skips or steps together. nullptr, or a factory that returns
  /// nullptr: plain training.
  TORCH_ARG(GradientSyncFactory, gradient_sync) = nullptr;
  /// FP8 matrix products in the model's Linear layers applied through
  /// lamp::nn::linear (lamp/nn/float8.h), with this recipe: the TrainStep
  /// converts the eligible layers (lamp::nn::convert_to_float8(), refused
  /// when none is) and lists the others in float8_conversion(). Combine with
  /// "amp-bf16" for Transformer Engine's setting (BF16 around FP8
  /// products). Also without this option (and under precision "fp8",
  /// which then keeps the owner's conversion instead of converting with
  /// the default recipe), a model converted before the TrainStep is built
  /// has its scales managed: after each cycle's backward
  /// the delayed scales are updated (update_float8_scales(), the amaxes
  /// agreed over the replicas of a data-parallel run), and save()/load()
  /// carry the scales and histories. Unset: no conversion.
  TORCH_ARG(c10::optional<nn::Float8Recipe>, float8) = c10::nullopt;
  /// Run the batch form of step() as CUDA graphs: after `graph_warmup_steps`
  /// eager steps per input shape (on a side stream), the whole step (zeroing
  /// the gradients, forward under autocast, scaled backward, master-gradient
  /// copy, unscale and clip, the fused optimizer step with its on-device
  /// skip, the scale update and the master-to-model copy) is captured once
  /// and replayed: one launch per step instead of hundreds. Needs a CUDA
  /// device, one of lamp::optim's optimizers on its fused kernels, no
  /// accumulation, no gradient synchroniser (data-parallel), and a loss
  /// function that never reads a value on the host (see
  /// TrainStep::cuda_graph_unavailable_reason). With kOn anything else is
  /// refused with the reason at the first step; kAuto falls back to eager
  /// steps. Graphs of different shapes share one memory pool. Off by default
  /// here, because a loss function that reads a value on the host cannot be
  /// captured; lamp's trainer defaults to kAuto. `cuda_graph(true)` /
  /// `cuda_graph(false)` are kOn / kOff.
  ///
  /// A graph bakes in what its capture saw, except the learning rates (read
  /// from device tensors, refreshed from the param groups before every
  /// replay) and the values of tensors. Before every step the TrainStep
  /// compares what it baked in (a private signature, host values only): the
  /// param groups (how many, which tensors), the options the optimizer says
  /// a capture bakes in (optim::AmpStep::baked_in_options(): SGD's momentum,
  /// dampening, nesterov and weight decay; Adam's betas, eps, weight decay
  /// and amsgrad), the parameters' requires_grad and storage, the buffers'
  /// storage, each module's train/eval mode, max_grad_norm, the scaler's
  /// growth settings and a load() of the optimizer's state. On a change every graph is
  /// forgotten and each shape warms up and is captured again, with a warning
  /// (once per process) naming what changed; cuda_graph_captures() counts
  /// the captures. After each step, parameters' (and masters') `.grad` hold
  /// the gradients that step computed, as in an eager step.
 public:
  TrainStepOptions& cuda_graph(CudaGraphMode mode) {
    cuda_graph_ = mode;
    return *this;
  }
  /// cuda_graph(CudaGraphMode): true is kOn, false kOff.
  TrainStepOptions& cuda_graph(bool on) {
    return cuda_graph(on ? CudaGraphMode::kOn : CudaGraphMode::kOff);
  }
  /// The CUDA-graph mode (kOff by default).
  CudaGraphMode cuda_graph() const { return cuda_graph_; }
  /// Eager steps per input shape before its graph is captured (>= 1: they
  /// create the optimizer state, the scaler's tensors and cuDNN's choices
  /// outside the capture).
  TORCH_ARG(int64_t, graph_warmup_steps) = 3;

 private:
  CudaGraphMode cuda_graph_ = CudaGraphMode::kOff;
};

/// Builds the optimizer over the parameters TrainStep hands it: the model's
/// own, or the FP32 master copies in the "half"/"bf16" modes.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::Tensor> params)>;

/// A model's parameters by qualified name ("layer1.0.bn1.weight"), in
/// named_parameters() order.
using NamedParameters = torch::OrderedDict<std::string, torch::Tensor>;
/// OptimizerFactory with each parameter's name ("layer1.0.bn1.weight"),
/// in named_parameters() order, for param groups chosen by name (another
/// learning rate for the head, no weight decay for some layers):
///
/// \code
///   lamp::TrainStep step(model, [](const lamp::NamedParameters& named) {
///     std::vector<torch::Tensor> head, body;
///     for (const auto& p : named) {
///       (p.key().rfind("fc.", 0) == 0 ? head : body).push_back(p.value());
///     }
///     std::vector<torch::optim::OptimizerParamGroup> groups;
///     groups.emplace_back(body);
///     groups.emplace_back(
///         head, std::make_unique<torch::optim::SGDOptions>(0.1));
///     return std::make_unique<lamp::optim::SGD>(
///         groups, torch::optim::SGDOptions(0.01));
///   });
/// \endcode
using NamedOptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(
        const NamedParameters& params)>;

/// What one TrainStep::step() call did. Nothing in it has been read on the
/// host: where the step ran sync-free, skipped() and `scale` are device
/// values, and reading them waits for the device.
struct StepResult {
  /// This micro-batch's loss as loss_fn returned it (detached, unscaled).
  torch::Tensor loss;
  /// Whether this call ended an accumulation cycle, that is, called the
  /// optimizer (whose step may still have been skipped).
  bool cycle_ended = false;
  /// The step's overflow flag, a one-element FP32 tensor (1: skipped for
  /// inf/NaN gradients; always 0 without a scaler); undefined when the cycle
  /// did not end.
  torch::Tensor found_inf;
  /// The loss scale after this call: a 0-dim FP32 tensor (on the training
  /// device with loss scaling; a CPU 1 without).
  torch::Tensor scale;
  /// The global L2 norm of the gradients before clipping, unscaled (the true
  /// norm, of the masters' gradients in "half"/"bf16"): a 0-dim tensor on
  /// the training device in the gradients' dtype (FP32 in every mode: the
  /// model's FP32 parameters or the FP32 masters), the one clipping computed
  /// anyway (lamp::optim::clip_grad_norm_'s return), so reporting
  /// it costs no kernel and no host sync (reading it waits for the device).
  /// inf or NaN where a gradient was (the step was then skipped, see
  /// skipped()). Undefined when clipping is off
  /// (TrainStepOptions::max_grad_norm 0): the norm would cost a pass over
  /// every gradient that the step does not otherwise make; for the norm
  /// without clipping set a max_grad_norm no gradient reaches (say 1e30).
  /// Undefined too when the cycle did not end. The CUDA-graph step reports
  /// it as the eager step does.
  ///
  /// Example:
  /// \code
  ///   auto result = train.step(x, y, loss_fn);
  ///   if (result.grad_norm.defined()) {
  ///     log.push_back(result.grad_norm);  // read later, in one batch
  ///   }
  /// \endcode
  torch::Tensor grad_norm;

  /// Whether this call ended a cycle but skipped the optimizer step because
  /// a gradient was inf/NaN (reads `found_inf`).
  bool skipped() const {
    return cycle_ended && found_inf.item<float>() != 0.0f;
  }
  /// Whether the optimizer stepped in this call (reads `found_inf`).
  bool optimizer_stepped() const {
    return cycle_ended && found_inf.item<float>() == 0.0f;
  }
};

/// A complete mixed-precision training step:
///
///  1. at the start of an accumulation cycle, the model's gradients are reset;
///  2. `loss_fn` runs (under lamp::Autocast in the AMP modes); its loss, over
///     `accumulation_steps`, is scaled and back-propagated;
///  3. at the end of the cycle: gradients go to the FP32 masters ("half",
///     "bf16"), are unscaled and clipped if asked, the optimizer steps unless
///     a gradient was non-finite, the scale is updated, and the masters are
///     copied back into the model.
///
/// With one of lamp::optim's optimizers on its fused kernels (the default
/// where the LibTorch has them), nothing in a step waits for the device: the
/// skip decision, the scale update and the clipping coefficient stay there
/// (GradScaler::step_async, optim::clip_grad_norm_). Other optimizers take
/// the synchronous path, one host read of the overflow flag per step.
///
/// In "half"/"bf16" the model is converted in place (lamp::convert_network,
/// BatchNorm kept FP32; a model with parameters in the mode's dtype, one
/// network_to_half() converted, stays as it is, whatever it kept FP32) and
/// the optimizer is built over the master weights. Inputs are
/// cast in one place: the batch form of step() and forward() cast them; a
/// closure given to step(loss_fn) runs a model that casts its own
/// (network_to_half's output), or calls cast_input(). "fp32" turns TF32 off
/// and "tf32" on
/// (CUDA; TrainStepOptions::tf32, undone when the TrainStep is destroyed).
/// FP16 modes on a device without FP16 kernels (CPU in LibTorch 1.13)
/// are refused at construction with a message naming the BF16 alternatives.
/// The optimizer gets the parameters that require grad, each tensor once (a
/// tied weight registered under two names is one parameter,
/// lamp::unique_named_parameters()); a model without any is refused at
/// construction.
///
/// A NaN or inf in the gradients skips the optimizer step in every mode
/// (TrainStepOptions::skip_non_finite, on by default), and a step that runs
/// out of memory says so, with what to change (lamp::with_memory_context).
///
/// Thread safety: one thread at a time per TrainStep (step() and load()
/// called from a second thread while one runs throw a c10::Error saying so,
/// rather than race); different TrainSteps on different threads are fine.
/// LibTorch's autocast state is per thread, so each step sets its own.
///
/// Example:
/// \code
///   auto net = MyNet();
///   lamp::TrainStep train(net.ptr(),
///       [](std::vector<torch::Tensor> params) {
///         return std::make_unique<lamp::optim::SGD>(
///             params, torch::optim::SGDOptions(0.1).momentum(0.9));
///       },
///       lamp::TrainStepOptions(lamp::Precision::kHalf).max_grad_norm(5.0));
///   for (auto& batch : loader) {
///     auto result = train.step(
///         batch.data, batch.target,
///         [&](const torch::Tensor& input, const torch::Tensor& target) {
///           return torch::nn::functional::cross_entropy(
///               net->forward(input).to(torch::kFloat), target);
///         });
///   }
/// \endcode
class TrainStep {
 public:
  /// Prepares `model` (on one device, with trainable parameters) for
  /// `options`' precision mode: converts it in "half"/"bf16", builds the
  /// gradient synchroniser, the master weights and then the optimizer with
  /// `make_optimizer`. TORCH_CHECK error for a null model or factory, a
  /// model with parameters on several devices or none that require grad,
  /// options out of range, or an FP16 mode the device cannot run.
  TrainStep(std::shared_ptr<torch::nn::Module> model,
            const OptimizerFactory& make_optimizer,
            TrainStepOptions options = {});
  /// With the parameters' names (NamedOptimizerFactory); otherwise the same.
  TrainStep(std::shared_ptr<torch::nn::Module> model,
            const NamedOptimizerFactory& make_optimizer,
            TrainStepOptions options = {});
  ~TrainStep();

  /// Move-constructible, into a container or out of a factory function:
  /// what points at what inside a TrainStep (the scaler's overflow reduction
  /// at the gradient synchroniser, the scaler's per-optimizer state at the
  /// optimizer, the graphs at their pool) lives on the heap and keeps its
  /// address, and no hook or callback holds the TrainStep's own address.
  /// A moved-from TrainStep may only be destroyed or assigned to. Moving one
  /// while a step() or load() runs on it (from another thread, or from the
  /// loss function) is undefined. Not copyable: it owns the optimizer, the
  /// master weights and the graphs.
  TrainStep(TrainStep&& other);
  /// Not assignable: the TrainStep assigned to would restore the TF32
  /// setting it found (TrainStepOptions::tf32) while `other`'s guard stays,
  /// out of the guards' nesting order. Hold it in a std::optional or a
  /// std::unique_ptr to replace it.
  TrainStep& operator=(TrainStep&& other) = delete;
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  /// Runs one micro-batch: forward and loss through `loss_fn`, backward, and
  /// at the end of an accumulation cycle the optimizer step. A step that
  /// throws (out of memory, a loss_fn that throws) discards its accumulation
  /// cycle, so that the next step starts one afresh: the gradients summed so
  /// far are cleared, the scaler forgets the cycle's unscale and overflow
  /// check (its scale stays), and the model takes the master weights'
  /// values. Catch it and step again with a smaller batch, say.
  StepResult step(const std::function<torch::Tensor()>& loss_fn);

  /// The loss of one batch: `input` already cast (cast_input), `target` as
  /// given.
  using BatchLossFn = std::function<torch::Tensor(const torch::Tensor& input,
                                                  const torch::Tensor& target)>;

  /// One step on a batch: loss_fn(cast_input(input), target) as in
  /// step(loss_fn). With `cuda_graph`, the step is captured per input shape
  /// and replayed from static copies of `input` and `target`.
  StepResult step(const torch::Tensor& input, const torch::Tensor& target,
                  const BatchLossFn& loss_fn);

  /// `input` cast to the model's dtype in "half"/"bf16" (floating tensors
  /// only); unchanged otherwise. The batch form of step() and forward() call
  /// it; a closure passed to step(loss_fn) needs it only for a model that
  /// does not cast its own inputs (network_to_half's output does).
  torch::Tensor cast_input(const torch::Tensor& input) const;

  /// A forward pass as the step runs it, for evaluation and inference:
  /// `forward(cast_input(input))` under the mode's autocast. Gradients are
  /// recorded as the caller's guards say (wrap it in a torch::NoGradGuard to
  /// evaluate). The output is in the model's dtype: FP16/BF16 in the
  /// low-precision modes, so compute losses on `.to(torch::kFloat)`.
  torch::Tensor forward(
      const std::function<torch::Tensor(const torch::Tensor&)>& forward,
      const torch::Tensor& input) const;

  /// The optimizer make_optimizer built (over the master weights in
  /// "half"/"bf16").
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  /// The loss scaler; disabled in the modes that do not scale the loss.
  GradScaler& scaler() { return scaler_; }
  /// The master weights in "half"/"bf16"; nullptr otherwise (also when
  /// the optimizer state is sharded: the shards are the masters then).
  /// \warning The masters are made from the model's weights when the
  /// TrainStep is built, and each step copies them into the model: load
  /// weights into the model before building it, or call
  /// master_weights()->model_params_to_master_params() after, or the next
  /// step overwrites them.
  MasterWeights* master_weights() { return master_.get(); }
  /// The sharding of the optimizer state over the ranks when the gradient
  /// synchroniser shards it (DataParallelOptions::zero_stage 1 or 2); nullptr
  /// otherwise. The optimizer then steps this rank's FP32 shards.
  OptimizerSharding* optimizer_sharding() { return sharding_.get(); }
  /// The gradient synchroniser when training data-parallel (a
  /// lamp::distributed::DataParallel from distributed::data_parallel());
  /// nullptr otherwise.
  GradientSync* gradient_sync() { return gradient_sync_.get(); }
  /// The options the step was made with.
  const TrainStepOptions& options() const { return options_; }
  /// What the precision mode decides (precision_policy()).
  const PrecisionPolicy& policy() const { return policy_; }
  /// The device of the model's parameters, where the step runs.
  const torch::Device& device() const { return device_; }

  /// Whether the batch form of step() runs as CUDA graphs: options'
  /// cuda_graph kOn, or kAuto where cuda_graph_unavailable_reason() is empty.
  bool cuda_graph_enabled() const { return graph_enabled_; }
  /// Why this step cannot run as CUDA graphs ("" when it can): a CPU model,
  /// accumulation_steps > 1, a gradient synchroniser (data-parallel), an
  /// optimizer that is not one of lamp::optim's on its fused kernels, or a
  /// scaler that reads the device (diagnose_overflow, or sync_free off). The
  /// loss function is not judged: one that reads the host fails at capture,
  /// with a message.
  std::string cuda_graph_unavailable_reason() const;
  /// Device memory the captured graphs hold between replays beyond live
  /// tensors (their intermediates, in the graphs' private pool): the caching
  /// allocator counts it as reserved, not allocated, so a peak of allocated
  /// memory taken after the capture misses it. 0 before any capture. Add it
  /// to peak_device_memory() for what a step needs.
  int64_t cuda_graph_pool_bytes() const;
  /// Device memory the captured graphs' pool reserves in all: the
  /// intermediates (cuda_graph_pool_bytes()) plus the live tensors in it
  /// (each shape's gradients, static inputs and outputs). 0 before any
  /// capture. Reads the caching allocator's snapshot: call it per epoch, not
  /// per step.
  int64_t cuda_graph_pool_reserved_bytes() const;
  /// CUDA graphs captured by this TrainStep: one per input shape, and again
  /// after a load() or a change of what they baked in (see
  /// TrainStepOptions::cuda_graph). 0 without CUDA graphs.
  int64_t cuda_graph_captures() const;

  /// Saves model, master weights, optimizer and scaler; with sharded
  /// optimizer state (optimizer_sharding()), this rank's shards and
  /// optimizer state only, with the world size and rank: each rank saves
  /// its own archive, and loads it with load() on the same
  /// number of ranks or load_resharded() on another. Only between
  /// optimizer steps: a checkpoint in the middle of an accumulation cycle
  /// would lose the gradients accumulated so far, so it is refused.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Loads what save() wrote, for a TrainStep built the same way. Every part
  /// is checked before the first is loaded: each tensor's shape and dtype
  /// against the live one (model parameters and buffers, master weights,
  /// optimizer state), no NaN or inf in weights, masters or optimizer state,
  /// and the scaler's fields. A refused checkpoint leaves model, optimizer,
  /// scaler and master weights as they were; the message names the tensor.
  /// What only the optimizer's own load() refuses (an option of the wrong
  /// type, a check of an optimizer of one's own) is refused before anything
  /// else is loaded, and the optimizer's state and options it had changed
  /// are put back. Sharded, the archive must be this rank's, of the same
  /// world size and layout (refused otherwise), and load() is a collective:
  /// every rank loads at the same point (the loaded shards are gathered into
  /// every rank's parameters), and a refusal on one rank, the optimizer's
  /// own included, is an error on every rank, none of which changes.
  void load(torch::serialize::InputArchive& archive);
  /// load() of a checkpoint saved by every rank of a sharded run
  /// (optimizer_sharding()) over any number of ranks: `every_rank[k]` is
  /// what rank k's save() wrote. Each rank passes all of them, in rank
  /// order, and takes its own shard of the master weights and optimizer
  /// state, cut anew for this run's number of ranks
  /// (OptimizerSharding::reshard). Model, scaler and settings come from
  /// rank 0's archive. Each rank holds the whole optimizer state while it
  /// loads. A collective (it gathers the weights), like load(); refused
  /// without sharding, and on archives that are not one checkpoint's.
  void load_resharded(std::vector<torch::serialize::InputArchive>& every_rank);

  /// The layers TrainStepOptions::float8 converted to FP8 and those it
  /// left, with the reason (empty without the option).
  const nn::Float8Conversion& float8_conversion() const {
    return float8_conversion_;
  }

 private:
  StepResult eager_step(const std::function<torch::Tensor()>& loss_fn);
  StepResult eager_step_once(const std::function<torch::Tensor()>& loss_fn);
  void discard_cycle() noexcept;
  StepResult batch_step(const torch::Tensor& input, const torch::Tensor& target,
                        const BatchLossFn& loss_fn);
  torch::Tensor current_scale() const;
  void check_graph_capturable();
  void warn_unused_float8_layers();

  std::shared_ptr<torch::nn::Module> model_;
  std::vector<torch::Tensor> model_params_;
  TrainStepOptions options_;
  PrecisionPolicy policy_;
  torch::Device device_;
  std::unique_ptr<MasterWeights> master_;
  std::unique_ptr<GradientSync> gradient_sync_;
  std::unique_ptr<OptimizerSharding> sharding_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  // The optimizer's parameters (masters in "half"/"bf16") by model name.
  std::unordered_map<const c10::TensorImpl*, std::string> param_names_;
  GradScaler scaler_;
  torch::Tensor unit_scale_;
  int64_t micro_step_ = 0;
  // The CUDA graphs, made by the first batch step that may capture.
  std::unique_ptr<detail::GraphStep> graphs_;
  // What the graphs baked in, and the tensors whose gradients they write;
  // made with graphs_.
  std::unique_ptr<detail::CaptureSignature> signature_;
  std::vector<torch::Tensor> grad_owners_;
  std::unique_ptr<Tf32Guard> tf32_;
  bool graph_enabled_ = false;
  // The model has FP8 layers (lamp::nn::convert_to_float8).
  bool float8_ = false;
  bool float8_use_checked_ = false;
  nn::Float8Conversion float8_conversion_;
  // step() and load() run on one thread at a time.
  detail::InUseFlag in_use_;
};

/// `torch::save(step, path)` / `torch::load(step, path)` and the archive
/// operators: TrainStep::save() and load().
inline torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive, const TrainStep& step) {
  step.save(archive);
  return archive;
}
/// Reads `step` from `archive` with TrainStep::load(): what
/// `torch::load(step, path)` calls.
inline torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive, TrainStep& step) {
  step.load(archive);
  return archive;
}

} // namespace lamp
