#include "lamp/distributed/sharded_optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "distributed/zero_sharding.h"

namespace lamp {
namespace distributed {
namespace {

using detail::bytes_of;

// The state tensors' bytes of the optimizers whose state lamp knows.
int64_t state_tensor_bytes(const torch::optim::OptimizerParamState& state) {
  if (const auto* sgd =
          dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    return bytes_of(sgd->momentum_buffer());
  }
  if (const auto* adam =
          dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return bytes_of(adam->exp_avg()) + bytes_of(adam->exp_avg_sq()) +
           bytes_of(adam->max_exp_avg_sq());
  }
  if (const auto* adamw =
          dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return bytes_of(adamw->exp_avg()) + bytes_of(adamw->exp_avg_sq()) +
           bytes_of(adamw->max_exp_avg_sq());
  }
  return 0;
}

} // namespace

struct ShardedOptimizer::Impl {
  explicit Impl(std::shared_ptr<ProcessGroup> group)
      : shards(std::move(group)) {}
  detail::ZeroSharding shards;
  std::vector<torch::Tensor> params;
  std::vector<ShardLayout> layouts;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

ShardedOptimizer::ShardedOptimizer(std::vector<torch::Tensor> params,
                                   Factory make_optimizer,
                                   std::shared_ptr<ProcessGroup> group)
    : impl_(std::make_unique<Impl>(std::move(group))) {
  TORCH_CHECK(make_optimizer != nullptr,
              "lamp::distributed::ShardedOptimizer: no optimizer factory.");
  auto& impl = *impl_;
  impl.params = params;
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    names.push_back(std::to_string(i));
  }
  impl.shards.build(std::move(params),
                    std::vector<size_t>(impl.params.size(), 0), names);
  impl.layouts = impl.shards.layouts();
  impl.optimizer = make_optimizer(impl.shards.shards());
  TORCH_CHECK(impl.optimizer != nullptr,
              "lamp::distributed::ShardedOptimizer: the optimizer factory "
              "returned null.");
  TORCH_CHECK(impl.optimizer->param_groups().size() == 1,
              "lamp::distributed::ShardedOptimizer: the optimizer has ",
              impl.optimizer->param_groups().size(),
              " parameter groups; it must take the shards as one group (one "
              "set of options for every parameter).");
}

ShardedOptimizer::~ShardedOptimizer() = default;

void ShardedOptimizer::step() {
  auto& impl = *impl_;
  impl.shards.gradients_to_shards();
  {
    torch::NoGradGuard no_grad;
    impl.optimizer->step();
  }
  impl.shards.shards_to_parameters();
}

void ShardedOptimizer::zero_grad() {
  for (auto& p : impl_->params) {
    p.mutable_grad() = torch::Tensor();
  }
}

torch::optim::Optimizer& ShardedOptimizer::optimizer() {
  return *impl_->optimizer;
}

const std::vector<torch::Tensor>& ShardedOptimizer::shards() const {
  return impl_->shards.shards();
}

const std::vector<ShardLayout>& ShardedOptimizer::layouts() const {
  return impl_->layouts;
}

int64_t ShardedOptimizer::state_bytes() const {
  return impl_->shards.bytes() + optimizer_state_bytes(*impl_->optimizer);
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& entry : optimizer.state()) {
    total += state_tensor_bytes(*entry.second);
  }
  return total;
}

} // namespace distributed
} // namespace lamp
