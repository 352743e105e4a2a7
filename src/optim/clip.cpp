#include "lamp/optim/clip.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "lamp/platform/parameters.h"

namespace lamp {
namespace optim {

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params,
                              double max_norm) {
  return clip_grad_norm_(params, max_norm, nullptr);
}

torch::Tensor clip_grad_norm_(
    const std::vector<torch::Tensor>& params, double max_norm,
    const std::function<void(torch::Tensor&)>& reduce_square_sum) {
  // An infinite max_norm measures the norm and scales by 1, as in Python.
  TORCH_CHECK(max_norm > 0,
              "lamp::optim::clip_grad_norm_: max_norm must be positive (inf "
              "only measures the norm), got ",
              max_norm, ".");
  torch::NoGradGuard no_grad;
  std::map<std::string, std::vector<torch::Tensor>> grads;
  std::vector<std::string> order; // devices in the order first seen
  // A tied weight listed twice has one gradient: counted and scaled once.
  lamp::detail::TensorIdentitySet seen;
  for (const auto& p : params) {
    const auto& grad = p.grad();
    if (!grad.defined() || !seen.insert(p)) {
      continue;
    }
    TORCH_CHECK(
        !grad.is_sparse(),
        "lamp::optim::clip_grad_norm_: sparse gradients are not supported.");
    const auto key = grad.device().str();
    if (grads.find(key) == grads.end()) {
      order.push_back(key);
    }
    grads[key].push_back(grad);
  }
  if (order.empty()) {
    if (!reduce_square_sum) {
      return torch::zeros({});
    }
    // The other ranks' gradients still count. On the parameters' device,
    // where the other ranks' sums are (a process group refuses a tensor on
    // another).
    auto square_sum = torch::zeros(
        {1}, torch::TensorOptions()
                 .dtype(torch::kFloat)
                 .device(params.empty() ? torch::Device(torch::kCPU)
                                        : params[0].device()));
    reduce_square_sum(square_sum);
    return square_sum.sqrt().reshape({});
  }
  const auto device = grads[order[0]][0].device();
  std::vector<torch::Tensor> partial;
  for (const auto& key : order) {
    const auto norms = at::_foreach_norm(grads[key], 2);
    partial.push_back(torch::stack(norms).norm().to(device));
  }
  auto total = partial.size() == 1 ? partial[0] : torch::stack(partial).norm();
  if (reduce_square_sum) {
    auto square_sum = total.to(torch::kFloat).square().reshape({1});
    reduce_square_sum(square_sum);
    total = square_sum.sqrt().reshape({}).to(total.scalar_type());
  }
  const auto coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (const auto& key : order) {
    auto& list = grads[key];
    const auto on_device = coefficient.to(list[0].device());
    at::_foreach_mul_(list, std::vector<torch::Tensor>(list.size(), on_device));
  }
  return total;
}

} // namespace optim
} // namespace lamp
