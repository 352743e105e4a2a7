#pragma once

/// \file
/// Numerics debugging: the first module whose output or gradient holds
/// inf/NaN, or FP16 values at the edge of FP16's range, named by its path in
/// the module tree.

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace lamp {

/// Options of NumericsCheck.
struct NumericsCheckOptions {
  /// Check the outputs of the forward pass's ops.
  TORCH_ARG(bool, forward) = true;
  /// Check the gradients of the backward pass: those arriving at each
  /// autograd node (the gradient of a module's output) and those accumulated
  /// into the parameters.
  TORCH_ARG(bool, backward) = true;
  /// FP16 values count as at the edge of the range above this fraction of
  /// FP16's largest finite value, 65504: at the default 0.5, above 32752,
  /// one doubling (a residual sum, a larger learning rate) from overflow.
  /// In (0, 1]; 1 flags inf/NaN only. BF16, FP32 and FP64 are checked for
  /// inf/NaN only, each in its own range (a finite double beyond FP32's
  /// range is finite).
  TORCH_ARG(double, fp16_range_fraction) = 0.5;
  /// Throw a c10::Error at a finding that stops (NumericsFinding::stops());
  /// false: observe() only returns it.
  TORCH_ARG(bool, stop) = true;
};

/// What NumericsCheck found: the first tensor of a step that holds inf/NaN
/// or, in FP16, values above the edge of the range.
struct NumericsFinding {
  int64_t step = 0;      ///< the step given to observe()
  bool backward = false; ///< false: a forward output; true: a gradient
  /// The module's path in the module tree ("layer2.0.conv1"); "" for the
  /// model itself (its own parameters), or for ops before any module with
  /// parameters ran (then `in_module` is false: the model's input).
  std::string module;
  /// Its C++ type (torch::nn::Module::name(), "torch::nn::Conv2dImpl").
  std::string module_type;
  /// true: the op read this module's parameters or buffers (its convolution,
  /// its linear map, its normalisation) or, in backward, is the gradient of
  /// such an op or of its parameters; false: a parameter-free op that ran
  /// after it (an activation, pooling, a residual sum, the loss).
  bool in_module = true;
  /// The op ("aten::conv2d") or the autograd node ("ConvolutionBackward0";
  /// "torch::autograd::AccumulateGrad": the gradient of a parameter).
  std::string op;
  /// For a parameter's gradient as the step left it (read after the step:
  /// what hooks on the parameter made): the parameter's name in its module
  /// ("weight"); empty otherwise.
  std::string parameter;
  torch::ScalarType dtype = torch::kFloat; ///< the tensor's dtype
  /// The largest magnitude in the tensor: inf, or NaN where it holds NaN.
  double max_abs = 0;
  /// inf/NaN (otherwise: FP16 values above the edge of the range).
  bool non_finite = false;
  /// A gradient of a step run under dynamic loss scaling: it holds the
  /// scaled gradients, whose overflow the GradScaler expects from time to
  /// time (it skips the step and backs off).
  bool loss_scaled = false;

  /// Whether the check stops on it: always, except for a non-finite gradient
  /// under dynamic loss scaling (see `loss_scaled`), which is the scaler's
  /// business.
  bool stops() const { return !(backward && loss_scaled); }
  /// One sentence: "step 12, forward: the output of module 'layer2.0.conv1'
  /// (torch::nn::Conv2dImpl, op aten::conv2d) holds inf/NaN (largest
  /// magnitude inf, Half)".
  std::string to_string() const;
};

/// Forward and backward checks for numerics debugging: observes one step,
/// then names the first module whose output or gradient holds inf/NaN or,
/// for FP16, values above `fp16_range_fraction` x 65504, with the module's
/// type, the dtype, the step, the direction and the largest magnitude; and
/// stops there with a c10::Error that says what to change.
///
/// How it sees modules. LibTorch's C++ modules have no forward hooks: a
/// module's forward is an ordinary, non-virtual member function that its
/// parent calls directly (`conv1->forward(x)`), so it can be neither hooked
/// nor wrapped from outside without changing the model's code. What can be
/// observed is every op: ATen's RecordFunction callbacks (the layer under
/// the profiler; `needsInputs`/`needsOutputs` in LibTorch 1.13 and 2.x
/// alike) see each op's inputs and outputs, and each autograd node's
/// incoming gradients. The check attributes them to modules by identity:
///
///  1. before the step, every parameter and buffer is mapped to the module
///     that registered it (`named_modules()`, the paths of state_dict);
///  2. forward: each outermost op run with grad mode on (the model's ops;
///     the optimizer's updates run under no_grad and are left out) belongs
///     to the module whose parameters or buffers it reads, alone or in a
///     list (an LSTM, GRU or RNN hands all its weights to aten::lstm,
///     aten::gru or aten::rnn_tanh as one Tensor[]), or, when it reads none
///     (relu, pooling, a residual sum), follows the last module that ran.
///     An op that reads only parameters (a transpose, chunk()) makes more of
///     its module's weights, each of its outputs, list elements included.
///     The largest magnitude of each floating-point output is recorded;
///  3. backward: each autograd node carries the sequence number of the
///     forward op that made it, so the gradients it receives (the gradient
///     of that op's output) go to that op's module; a parameter's
///     accumulated gradient goes to the module whose node produced it;
///  4. after the step, each parameter's gradient is added, last module first
///     (hooks on a parameter change its gradient where no observer sees it),
///     the magnitudes are read at once (one host read per step) and the
///     first offending one, in execution order, is the finding.
///
/// This needs nothing from the model: lamp's models (MnistCNN, the ResNets)
/// and any user's module tree are checked as they are, provided each
/// module's computation reads its own parameters (as every torch::nn module
/// does). Parameter-free modules (ReLU, pooling, Flatten) have nothing to be
/// recognised by: what they compute is reported as "after" the module that
/// ran before them. Ops inside a custom autograd Function's forward run
/// under no_grad and are seen through their result's next use.
///
/// Loss scaling: a non-finite gradient under dynamic loss scaling is
/// returned (NumericsFinding::loss_scaled), never stopped on, and FP16
/// gradients are not held to the range edge there: scaled gradients live
/// near it by design, and an occasional overflow is how the scaler finds its
/// scale. With a static scale (or none), a non-finite gradient stops.
///
/// Cost: an observer on every op, a reduction per output and per gradient,
/// one host read per step; see docs/training.md, "Numerics debugging", for measurements.
/// Meant for debugging runs, off in lamp's trainer unless asked for
/// (TrainerOptions::check_numerics, the programs' --check-numerics). A step
/// under observation must run eagerly: a replayed CUDA graph runs no ops for
/// the observers to see.
///
/// One observe() at a time per process (a second one, from another thread,
/// is refused); the observers are the calling thread's, and autograd's
/// worker threads inherit them for the step's backward.
///
/// Example:
/// \code
///   lamp::NumericsCheck check(model.ptr());
///   for (int64_t step = 0; step < steps; ++step) {
///     optimizer.zero_grad();
///     // Throws, naming e.g. module 'layer2.0.conv1' and what to change.
///     check.observe(step, [&] {
///       auto loss = torch::nn::functional::cross_entropy(
///           model->forward(images), labels);
///       loss.backward();
///     });
///     optimizer.step();
///   }
/// \endcode
class NumericsCheck {
 public:
  /// Checks `model`'s module tree. TORCH_CHECK error for a null model or an
  /// fp16_range_fraction outside (0, 1].
  explicit NumericsCheck(std::shared_ptr<torch::nn::Module> model,
                         NumericsCheckOptions options = {});

  /// Runs `fn` (a forward and backward pass, or a whole training step) under
  /// observation as step `step`; `loss_scaled`: its backward runs on a loss
  /// scaled by a dynamic GradScaler. Returns the step's first finding, or
  /// nullopt when its numerics are clean; throws a c10::Error naming it, and
  /// what to change, when it stops() and `stop` is set. An exception from
  /// `fn` passes through, with the observers removed.
  c10::optional<NumericsFinding> observe(int64_t step,
                                         const std::function<void()>& fn,
                                         bool loss_scaled = false);

  /// The options the check was made with.
  const NumericsCheckOptions& options() const { return options_; }

  /// The c10::Error's message for `finding`: its to_string() and what to
  /// change.
  static std::string message(const NumericsFinding& finding);

 private:
  std::shared_ptr<torch::nn::Module> model_;
  NumericsCheckOptions options_;
};

} // namespace lamp
