#pragma once

/// \file
/// FP32 master weights for a low-precision model (Apex `fp16_utils`, fastai
/// `fp16util`).

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lamp {

/// Holds an FP32 copy of a low-precision model's parameters for the optimizer
/// to update (Micikevicius et al., 2018: updates smaller than FP16's resolution
/// vanish when applied to FP16 weights).
///
/// One training step with it:
///  1. forward and backward run on the FP16/BF16 model;
///  2. model_grads_to_master_grads() copies the gradients into FP32 (and, with
///     a loss scale, unscales them in the same pass);
///  3. the optimizer, built over master_params(), steps in FP32;
///  4. master_params_to_model_params() copies the result back to the model.
///
/// With `flat = true` all master values live in one FP32 buffer and all master
/// gradients in another (one allocation each, a view per parameter): gradient
/// copies and unscaling then take one kernel each instead of one per tensor.
///
/// Example:
/// \code
///   auto model = lamp::network_to_half(net);
///   lamp::MasterWeights master(model->parameters());
///   torch::optim::SGD optimizer(master.master_params(), 0.1);
///   // ... scaler.scale(loss).backward();
///   master.model_grads_to_master_grads();
///   if (scaler.step(optimizer)) master.master_params_to_model_params();
///   scaler.update();
/// \endcode
///
/// \warning The model's FP16 `.grad` stays *scaled*: only the master gradients
/// are unscaled. Zero the model's gradients yourself before the next backward
/// (the optimizer only sees the masters).
class MasterWeights {
 public:
  /// Copies `model_params` into FP32 leaves that require grad. Each tensor is
  /// a copy even when the model parameter is already FP32 (e.g. BatchNorm).
  /// A tensor given twice (a tied weight in `model->parameters()`) is kept
  /// once, at its first position (lamp::unique_parameters()).
  ///
  /// Thread safety: one thread at a time per object (no method is
  /// synchronised); different objects on different threads are fine.
  explicit MasterWeights(std::vector<torch::Tensor> model_params,
                         bool flat = false);

  /// The FP32 tensors to give to the optimizer, in the model's order.
  const std::vector<torch::Tensor>& master_params() const { return master_; }
  /// The model's parameters, as given, each tensor once.
  const std::vector<torch::Tensor>& model_params() const { return model_; }
  /// Whether the masters live in one flat buffer (constructed with `flat`).
  bool flat() const { return flat_buffer_.defined(); }
  /// The one FP32 buffer behind master_params() (undefined unless flat).
  const torch::Tensor& flat_buffer() const { return flat_buffer_; }
  /// The one FP32 buffer behind the master gradients (undefined unless flat).
  const torch::Tensor& flat_grad_buffer() const { return flat_grad_; }

  /// Copies the model's gradients into the master gradients, divided by
  /// `loss_scale` in the same pass. A parameter without a gradient leaves its
  /// master without one (as Apex does), so optimizers skip it. A sparse
  /// gradient (an Embedding with sparse=true) gives its master a sparse FP32
  /// one, coalesced in FP32. A `loss_scale` whose inverse FP32 cannot hold
  /// is refused.
  void model_grads_to_master_grads(double loss_scale = 1.0);

  /// Copies the FP32 master values into the model's parameters (cast to each
  /// parameter's dtype).
  void master_params_to_model_params();

  /// The other way: copies the model's parameters into the masters, widened
  /// to FP32, in place (the optimizer's references to them stay valid). For
  /// weights changed in the model after the masters were made (a
  /// torch::load into the model): without it, the next step copies the
  /// masters back over them.
  /// \warning The masters then hold the model's FP16/BF16 values, rounded;
  /// FP32 weights are better loaded with lamp::training::
  /// load_weights_from_checkpoint() or MasterWeights::load().
  void model_params_to_master_params();

  /// Names the parameters, in the order they were given (such as the keys of
  /// `model->named_parameters()`): save() then keys the tensors by name, and
  /// load() finds them by name (also after the parameters' order changed)
  /// and names them in its messages. Either one name per model_params()
  /// entry, or one per tensor as given to the constructor (with a tied
  /// weight's second name, which is dropped with its tensor). The names must
  /// be unique and non-empty, and neither "count" nor "keyed_by" (the
  /// archive's own keys); otherwise a c10::Error, and the names stay as
  /// they were.
  void set_parameter_names(std::vector<std::string> names);

  /// Writes the FP32 master values; they are saved, never rebuilt from FP16.
  /// Keys: the parameters' names when set_parameter_names() was called,
  /// else their positions "0", "1", ... (what lamp 0.1 wrote; load() reads
  /// both).
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote into the existing master tensors, keeping the
  /// optimizer's references to them valid, then copies them to the model
  /// (master_params_to_model_params()), which follows its masters. Every
  /// tensor is checked before the first is copied (the count; each one's
  /// shape and dtype; no NaN or inf): a refused load leaves the masters and
  /// the model as they were.
  void load(torch::serialize::InputArchive& archive);
  /// load()'s reading and checking alone: the saved tensors, with nothing
  /// changed.
  std::vector<torch::Tensor> read(
      torch::serialize::InputArchive& archive) const;

 private:
  void make_masters(bool flat);

  std::vector<torch::Tensor> model_;
  std::vector<torch::Tensor> master_;
  torch::Tensor flat_buffer_;
  torch::Tensor flat_grad_;
  std::vector<torch::Tensor> flat_grad_views_;
  std::vector<std::string> names_; // empty: unnamed
  // The constructor's list: its length, and the positions kept in model_.
  size_t given_count_ = 0;
  std::vector<size_t> kept_;
};

/// `torch::save(master, path)` / `torch::load(master, path)` and the archive
/// operators: MasterWeights::save() and load().
inline torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive, const MasterWeights& master) {
  master.save(archive);
  return archive;
}
/// Reads `master` from `archive` with MasterWeights::load(): what
/// `torch::load(master, path)` calls.
inline torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive, MasterWeights& master) {
  master.load(archive);
  return archive;
}

/// Apex's `prep_param_lists(model, flat_master)`: the parameters of `model`
/// that require grad, and their FP32 master copies (with `flat_master`, a
/// single flat FP32 tensor holding all of them, with an allocated gradient).
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>
prep_param_lists(const torch::nn::Module& model, bool flat_master = false);

/// Apex's `model_grads_to_master_grads`: copies each model gradient into the
/// matching master gradient (allocating it if needed; a missing model
/// gradient leaves the master without one; a sparse one becomes a sparse
/// FP32 gradient). With `flat_master`, all model gradients are flattened
/// into `master_params[0]`'s gradient (a sparse one is refused).
void model_grads_to_master_grads(
    const std::vector<torch::Tensor>& model_params,
    const std::vector<torch::Tensor>& master_params, bool flat_master = false);

/// Apex's `master_params_to_model_params`: copies the master values back into
/// the model parameters. With `flat_master`, `master_params[0]` is unflattened
/// into them.
void master_params_to_model_params(
    const std::vector<torch::Tensor>& model_params,
    const std::vector<torch::Tensor>& master_params, bool flat_master = false);

/// FP32 masters of `model`'s trainable parameters (requires_grad, each
/// tensor once), named, in the order TrainStep trains them and gives them
/// to an OptimizerSharding: a whole copy where a sharded TrainStep keeps
/// none, to load FP32 weights into (then OptimizerSharding::set_masters)
/// or to gather them into (OptimizerSharding::gather_masters).
std::unique_ptr<MasterWeights> trainable_masters(
    const torch::nn::Module& model);

} // namespace lamp
