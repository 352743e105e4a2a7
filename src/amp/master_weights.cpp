#include "lamp/amp/master_weights.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "lamp/platform/out_of_memory.h"
#include "lamp/platform/parameters.h"
#include "platform/archive.h"
#include "platform/compat.h"

namespace lamp {
namespace {

std::vector<torch::Tensor> flattened(
    const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) {
    flat.push_back(t.detach().reshape({-1}));
  }
  return flat;
}

torch::Tensor fp32_leaf_copy(const torch::Tensor& param) {
  return param.detach()
      .to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true)
      .requires_grad_(true);
}

void check_pairing(const std::vector<torch::Tensor>& model_params,
                   const std::vector<torch::Tensor>& master_params,
                   bool flat_master, const char* caller) {
  if (flat_master) {
    TORCH_CHECK(
        master_params.size() == 1, caller,
        ": with flat_master, master_params must hold the one flat tensor made by prep_param_lists(model, true); got ",
        master_params.size(), " tensors.");
    int64_t numel = 0;
    for (const auto& p : model_params) {
      numel += p.numel();
    }
    const auto& flat = master_params[0];
    TORCH_CHECK(flat.defined() && flat.dim() == 1 && flat.is_contiguous() &&
                    flat.scalar_type() == torch::kFloat,
                caller,
                ": with flat_master, the master must be one contiguous 1-D "
                "FP32 tensor, got ",
                flat.defined()
                    ? flat.toString() + " of shape " + c10::str(flat.sizes())
                    : std::string("an undefined tensor"),
                "; pass the lists returned by prep_param_lists(model, true).");
    TORCH_CHECK(flat.numel() == numel, caller, ": the flat master holds ",
                flat.numel(), " values but the model parameters hold ", numel,
                "; pass the two lists returned by prep_param_lists().");
    for (size_t i = 0; i < model_params.size(); ++i) {
      TORCH_CHECK(model_params[i].device() == flat.device(), caller,
                  ": model parameter ", i, " is on ", model_params[i].device(),
                  ", the flat master on ", flat.device(),
                  "; a flat master needs every parameter on its device "
                  "(prep_param_lists(model, false) otherwise).");
    }
    return;
  }
  TORCH_CHECK(model_params.size() == master_params.size(), caller,
              ": model_params has ", model_params.size(),
              " tensors but master_params has ", master_params.size(),
              "; pass the two lists returned by prep_param_lists().");
  for (size_t i = 0; i < model_params.size(); ++i) {
    TORCH_CHECK(model_params[i].sizes() == master_params[i].sizes(), caller,
                ": model parameter ", i, " has shape ", model_params[i].sizes(),
                " but its master has shape ", master_params[i].sizes(),
                "; pass the two lists returned by prep_param_lists().");
  }
}

} // namespace

MasterWeights::MasterWeights(std::vector<torch::Tensor> model_params, bool flat)
    : given_count_(model_params.size()) {
  // A tied weight (listed once per registration by LibTorch's parameters())
  // gets one master: two would be updated separately and copied back in
  // turn, the last one winning.
  detail::TensorIdentitySet seen;
  for (size_t i = 0; i < model_params.size(); ++i) {
    if (!model_params[i].defined() || seen.insert(model_params[i])) {
      kept_.push_back(i);
      model_.push_back(std::move(model_params[i]));
    }
  }
  TORCH_CHECK(
      !model_.empty(),
      "lamp::MasterWeights: no parameters given; pass the model's parameters(), e.g. MasterWeights(model->parameters()).");
  for (size_t i = 0; i < model_.size(); ++i) {
    TORCH_CHECK(
        model_[i].defined() && model_[i].is_floating_point(),
        "lamp::MasterWeights: parameter ", i,
        " is undefined or not floating point; master weights are made for floating-point parameters only.");
    TORCH_CHECK(
        !flat || model_[i].device() == model_[0].device(),
        "lamp::MasterWeights: flat=true needs every parameter on one device, but parameter ",
        i, " is on ", model_[i].device(), " and parameter 0 on ",
        model_[0].device(), "; use flat=false.");
  }
  int64_t numel = 0;
  for (const auto& p : model_) {
    numel += p.numel();
  }
  with_memory_context("the FP32 master weights", numel * 4 * (flat ? 2 : 1),
                      [&] { make_masters(flat); });
}

void MasterWeights::make_masters(bool flat) {
  torch::NoGradGuard no_grad;
  if (!flat) {
    master_.reserve(model_.size());
    for (const auto& p : model_) {
      master_.push_back(fp32_leaf_copy(p));
    }
    return;
  }
  const auto options =
      torch::TensorOptions().dtype(torch::kFloat).device(model_[0].device());
  flat_buffer_ = torch::cat(flattened(model_)).to(torch::kFloat);
  flat_grad_ = torch::zeros_like(flat_buffer_, options);
  int64_t offset = 0;
  for (const auto& p : model_) {
    const int64_t n = p.numel();
    // Views of a buffer that does not require grad are leaves: they can
    // require grad themselves and be optimised, while updates land in the
    // one buffer.
    master_.push_back(
        flat_buffer_.narrow(0, offset, n).view(p.sizes()).requires_grad_(true));
    // Detached: optimizers' zero_grad() detaches gradients in place, which
    // autograd refuses for views.
    flat_grad_views_.push_back(
        flat_grad_.narrow(0, offset, n).view(p.sizes()).detach());
    offset += n;
  }
}

void MasterWeights::model_grads_to_master_grads(double loss_scale) {
  TORCH_CHECK(
      std::isfinite(loss_scale) && loss_scale > 0,
      "lamp::MasterWeights::model_grads_to_master_grads: loss_scale must be finite and positive, got ",
      loss_scale, ".");
  torch::NoGradGuard no_grad;
  // Same unscale factor as GradScaler: 1/scale computed in double, applied in
  // FP32.
  const float inv_scale = static_cast<float>(1.0 / loss_scale);
  TORCH_CHECK(
      std::isfinite(inv_scale) && inv_scale > 0.0f,
      "lamp::MasterWeights::model_grads_to_master_grads: 1/loss_scale for loss_scale=",
      loss_scale,
      " is not representable in float32 (the gradients would become inf/NaN or 0); use a loss scale in [",
      1.0 / static_cast<double>(std::numeric_limits<float>::max()), ", ",
      1.0 / static_cast<double>(std::numeric_limits<float>::denorm_min()),
      "].");
  // Sparse gradients (an Embedding with sparse=true) stay sparse: the masters
  // get sparse FP32 gradients, not a flat buffer's dense views.
  bool all_dense = true;
  for (const auto& p : model_) {
    all_dense = all_dense && p.grad().defined() && !p.grad().is_sparse();
  }
  if (flat() && all_dense) {
    std::vector<torch::Tensor> grads;
    grads.reserve(model_.size());
    for (const auto& p : model_) {
      grads.push_back(p.grad().reshape({-1}));
    }
    flat_grad_.copy_(torch::cat(grads));
    if (inv_scale != 1.0f) {
      flat_grad_.mul_(inv_scale);
    }
    for (size_t i = 0; i < master_.size(); ++i) {
      master_[i].mutable_grad() = flat_grad_views_[i];
    }
    return;
  }
  if (flat()) {
    for (size_t i = 0; i < master_.size(); ++i) {
      const auto& grad = model_[i].grad();
      master_[i].mutable_grad() = grad.defined() && !grad.is_sparse()
                                      ? flat_grad_views_[i]
                                      : torch::Tensor();
    }
  }
  lamp::model_grads_to_master_grads(model_, master_, /*flat_master=*/false);
  if (inv_scale != 1.0f) {
    std::vector<torch::Tensor> grads;
    for (const auto& m : master_) {
      if (!m.grad().defined()) {
        continue;
      }
      if (m.grad().is_sparse()) {
        // Coalesced (unique indices): scaling the values scales the sum.
        m.grad().mul_(inv_scale);
      } else {
        grads.push_back(m.grad());
      }
    }
    if (!grads.empty()) {
      torch::_foreach_mul_(grads, inv_scale);
    }
  }
}

void MasterWeights::master_params_to_model_params() {
  lamp::master_params_to_model_params(model_, master_, /*flat_master=*/false);
}

void MasterWeights::model_params_to_master_params() {
  torch::NoGradGuard no_grad;
  // In place: the optimizer's references to the masters stay valid.
  detail::foreach_copy_(master_, model_);
}

namespace {
// Named masters are saved under their parameters' names, marked so; older
// archives (and unnamed masters) use positions "0", "1", ...
constexpr const char* kKeyedBy = "keyed_by";
} // namespace

void MasterWeights::save(torch::serialize::OutputArchive& archive) const {
  archive.write("count", c10::IValue(static_cast<int64_t>(master_.size())));
  if (!names_.empty()) {
    archive.write(kKeyedBy, c10::IValue(std::string("name")));
  }
  for (size_t i = 0; i < master_.size(); ++i) {
    archive.write(names_.empty() ? std::to_string(i) : names_[i],
                  master_[i].detach());
  }
}

void MasterWeights::set_parameter_names(std::vector<std::string> names) {
  TORCH_CHECK(
      names.size() == model_.size() || names.size() == given_count_,
      "lamp::MasterWeights::set_parameter_names: ", names.size(), " names for ",
      model_.size(),
      " parameters; give one name per parameter, in the order the parameters were given.");
  if (names.size() != model_.size()) {
    // One per parameter as given: a tied weight keeps its first name.
    std::vector<std::string> kept;
    for (const auto i : kept_) {
      kept.push_back(std::move(names[i]));
    }
    names = std::move(kept);
  }
  // The names key the saved tensors, next to the archive's own entries: a
  // repeated name would save one tensor over another and load it into both.
  std::map<std::string, size_t> first;
  for (size_t i = 0; i < names.size(); ++i) {
    TORCH_CHECK(!names[i].empty(),
                "lamp::MasterWeights::set_parameter_names: parameter ", i,
                " has an empty name; the names key the saved masters.");
    TORCH_CHECK(
        names[i] != "count" && names[i] != kKeyedBy,
        "lamp::MasterWeights::set_parameter_names: parameter ", i,
        " is named '", names[i],
        "', a name the saved archive uses for itself; rename it (prefix the names, e.g. \"model.\" + name).");
    const auto seen = first.emplace(names[i], i);
    TORCH_CHECK(
        seen.second, "lamp::MasterWeights::set_parameter_names: parameters ",
        seen.first->second, " and ", i, " are both named '", names[i],
        "'; the names key the saved masters and must be unique (prefix each module's names, e.g. \"body.\" + name, \"head.\" + name).");
  }
  names_ = std::move(names);
}

std::vector<torch::Tensor> MasterWeights::read(
    torch::serialize::InputArchive& archive) const {
  constexpr const char* kCaller = "lamp::MasterWeights::load";
  const int64_t count = detail::read_int(archive, "count", kCaller);
  TORCH_CHECK(count == static_cast<int64_t>(master_.size()), kCaller,
              ": the archive holds ", count,
              " master tensors but this model has ", master_.size(),
              "; load a checkpoint saved from the same model.");
  c10::IValue keyed_by;
  const bool by_name = archive.try_read(kKeyedBy, keyed_by);
  if (by_name) {
    TORCH_CHECK(
        keyed_by.isString() && keyed_by.toStringRef() == "name", kCaller,
        ": the archive's '", kKeyedBy,
        "' is not \"name\"; it is corrupt or was written by a newer lamp.");
    TORCH_CHECK(
        !names_.empty(), kCaller,
        ": the archive keys the master tensors by parameter name, but these master weights have no names; call set_parameter_names() before load().");
  }
  std::vector<torch::Tensor> saved(master_.size());
  for (size_t i = 0; i < master_.size(); ++i) {
    std::string what = "master tensor " + std::to_string(i);
    if (!names_.empty()) {
      what += " ('" + names_[i] + "')";
    }
    saved[i] = detail::read_checked_tensor(
        archive, by_name ? names_[i] : std::to_string(i), master_[i], what,
        /*finite=*/true, kCaller);
  }
  return saved;
}

void MasterWeights::load(torch::serialize::InputArchive& archive) {
  const auto saved = read(archive);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) {
    master_[i].copy_(saved[i]);
  }
  // The model follows its masters: a forward pass after the load runs on
  // the weights loaded, not on those the model was built with.
  master_params_to_model_params();
}

std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>
prep_param_lists(const torch::nn::Module& model, bool flat_master) {
  std::vector<torch::Tensor> model_params;
  for (const auto& p : unique_parameters(model)) {
    if (p.requires_grad()) {
      model_params.push_back(p);
    }
  }
  TORCH_CHECK(
      !model_params.empty(),
      "lamp::prep_param_lists: the model has no parameter that requires grad.");
  for (size_t i = 0; i < model_params.size(); ++i) {
    TORCH_CHECK(
        !flat_master || model_params[i].device() == model_params[0].device(),
        "lamp::prep_param_lists: flat_master needs every parameter on one "
        "device, but parameter ",
        i, " is on ", model_params[i].device(), " and parameter 0 on ",
        model_params[0].device(), "; use flat_master=false.");
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> master_params;
  if (flat_master) {
    auto master = torch::cat(flattened(model_params))
                      .to(torch::kFloat)
                      .requires_grad_(true);
    master.mutable_grad() = torch::empty_like(master);
    master_params.push_back(master);
  } else {
    for (const auto& p : model_params) {
      master_params.push_back(fp32_leaf_copy(p));
    }
  }
  return {model_params, master_params};
}

void model_grads_to_master_grads(
    const std::vector<torch::Tensor>& model_params,
    const std::vector<torch::Tensor>& master_params, bool flat_master) {
  check_pairing(model_params, master_params, flat_master,
                "lamp::model_grads_to_master_grads");
  torch::NoGradGuard no_grad;
  if (flat_master) {
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < model_params.size(); ++i) {
      TORCH_CHECK(
          model_params[i].grad().defined(),
          "lamp::model_grads_to_master_grads: with flat_master every model parameter needs a gradient, but parameter ",
          i, " has none.");
      TORCH_CHECK(
          !model_params[i].grad().is_sparse(),
          "lamp::model_grads_to_master_grads: parameter ", i,
          " has a sparse gradient (an Embedding with sparse=true), which a flat master cannot hold; use flat_master=false (a sparse FP32 gradient per master) or a dense Embedding.");
      grads.push_back(model_params[i].grad().reshape({-1}));
    }
    auto master = master_params[0];
    if (!master.grad().defined()) {
      master.mutable_grad() = torch::empty_like(master);
    }
    master.grad().copy_(torch::cat(grads));
    return;
  }
  for (size_t i = 0; i < model_params.size(); ++i) {
    auto master = master_params[i];
    const auto& grad = model_params[i].grad();
    if (!grad.defined()) {
      master.mutable_grad() = torch::Tensor();
      continue;
    }
    if (grad.is_sparse()) {
      // A sparse FP32 gradient, as the optimizers and GradScaler take it;
      // coalesced in FP32, so that repeated FP16 indices cannot overflow.
      master.mutable_grad() = grad.to(torch::kFloat).coalesce();
      continue;
    }
    if (!master.grad().defined() || master.grad().is_sparse()) {
      master.mutable_grad() = torch::empty_like(master);
    }
    master.grad().copy_(grad);
  }
}

void master_params_to_model_params(
    const std::vector<torch::Tensor>& model_params,
    const std::vector<torch::Tensor>& master_params, bool flat_master) {
  check_pairing(model_params, master_params, flat_master,
                "lamp::master_params_to_model_params");
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t i = 0; i < model_params.size(); ++i) {
    auto model = model_params[i];
    if (flat_master) {
      const int64_t n = model.numel();
      model.copy_(master_params[0].narrow(0, offset, n).view(model.sizes()));
      offset += n;
    } else {
      model.copy_(master_params[i]);
    }
  }
}

std::unique_ptr<MasterWeights> trainable_masters(
    const torch::nn::Module& model) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : unique_named_parameters(model)) {
    if (item.value().requires_grad()) {
      names.push_back(item.key());
      params.push_back(item.value());
    }
  }
  auto masters = std::make_unique<MasterWeights>(std::move(params));
  masters->set_parameter_names(std::move(names));
  return masters;
}

} // namespace lamp
