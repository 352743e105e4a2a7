#include "lamp/distributed/sharded_optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <utility>

namespace lamp {
namespace distributed {
namespace {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

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
  // The parameters of one dtype, laid out over the ranks.
  struct DtypeGroup {
    torch::Dtype dtype;
    std::vector<size_t> members; // indices into params
    std::vector<ShardLayout::Piece> mine;
    // The gathered weights in the parameters' dtype (padded), and this
    // rank's part of them before the gather.
    torch::Tensor flat;
    torch::Tensor outgoing;
  };
  std::vector<torch::Tensor> params;
  std::shared_ptr<ProcessGroup> group;
  std::vector<DtypeGroup> groups;
  std::vector<ShardLayout> layouts;
  std::vector<torch::Tensor> shards; // FP32, one per group
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

ShardedOptimizer::ShardedOptimizer(std::vector<torch::Tensor> params,
                                   Factory make_optimizer,
                                   std::shared_ptr<ProcessGroup> group)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(group != nullptr,
              "lamp::distributed::ShardedOptimizer: the process group is "
              "null; give ProcessGroup::from_environment()'s.");
  TORCH_CHECK(make_optimizer != nullptr,
              "lamp::distributed::ShardedOptimizer: no optimizer factory.");
  TORCH_CHECK(!params.empty(),
              "lamp::distributed::ShardedOptimizer: no parameters to train.");
  torch::NoGradGuard no_grad;
  auto& impl = *impl_;
  impl.params = std::move(params);
  impl.group = std::move(group);
  const int world = impl.group->world_size();
  const int rank = impl.group->rank();
  std::vector<RankSetting> settings;
  for (size_t i = 0; i < impl.params.size(); ++i) {
    const auto& p = impl.params[i];
    TORCH_CHECK(p.defined() && p.is_floating_point(),
                "lamp::distributed::ShardedOptimizer: parameter ", i, " is ",
                p.defined() ? "not floating point" : "undefined",
                "; give the model's trainable parameters.");
    TORCH_CHECK(p.device() == impl.group->device(),
                "lamp::distributed::ShardedOptimizer: parameter ", i, " is on ",
                p.device(), " but the group communicates on ",
                impl.group->device(), ".");
    TORCH_CHECK(p.is_contiguous(),
                "lamp::distributed::ShardedOptimizer: parameter ", i,
                " is not contiguous (a channels-last weight?); its elements "
                "could not be laid out by their order in memory.");
    std::ostringstream what;
    what << p.scalar_type() << " " << p.sizes();
    settings.emplace_back("parameter " + std::to_string(i), what.str());
    size_t g = 0;
    while (g < impl.groups.size() && impl.groups[g].dtype != p.scalar_type()) {
      ++g;
    }
    if (g == impl.groups.size()) {
      impl.groups.push_back({p.scalar_type(), {}, {}, {}, {}});
    }
    impl.groups[g].members.push_back(i);
  }
  impl.group->check_same("the parameters given to ShardedOptimizer", settings,
                         "Every rank must build the same model and give "
                         "ShardedOptimizer its parameters in the same order.");
  for (auto& g : impl.groups) {
    std::vector<int64_t> numels;
    for (const auto i : g.members) {
      numels.push_back(impl.params[i].numel());
    }
    impl.layouts.emplace_back(numels, world);
    const auto& layout = impl.layouts.back();
    g.mine = layout.pieces(rank);
    const auto options =
        torch::TensorOptions().dtype(g.dtype).device(impl.group->device());
    g.flat = torch::zeros({layout.padded_numel()}, options);
    g.outgoing = torch::empty({layout.shard_numel()}, options);
    // This rank's FP32 master weights, from its pieces of the parameters
    // (the padding stays zero).
    auto shard =
        torch::zeros({layout.shard_numel()}, options.dtype(torch::kFloat));
    for (const auto& piece : g.mine) {
      shard.narrow(0, piece.shard_offset, piece.length)
          .copy_(impl.params[g.members[piece.tensor]].reshape(-1).narrow(
              0, piece.tensor_offset, piece.length));
    }
    shard.set_requires_grad(true);
    shard.mutable_grad() = torch::zeros_like(shard);
    impl.shards.push_back(shard);
  }
  impl.optimizer = make_optimizer(impl.shards);
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
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    const auto& group = impl.groups[g];
    auto& grad = impl.shards[g].mutable_grad();
    grad.zero_();
    for (const auto& piece : group.mine) {
      const auto& param_grad = impl.params[group.members[piece.tensor]].grad();
      if (param_grad.defined()) {
        grad.narrow(0, piece.shard_offset, piece.length)
            .copy_(param_grad.reshape(-1).narrow(0, piece.tensor_offset,
                                                 piece.length));
      }
    }
  }
  impl.optimizer->step();
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    auto& group = impl.groups[g];
    group.outgoing.copy_(impl.shards[g]);
    impl.group->all_gather_(group.flat, group.outgoing,
                            "the gather of the sharded optimizer's weights");
    const auto& layout = impl.layouts[g];
    for (size_t k = 0; k < group.members.size(); ++k) {
      auto& p = impl.params[group.members[k]];
      p.view(-1).copy_(group.flat.narrow(0, layout.offset(k), p.numel()));
    }
  }
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
  return impl_->shards;
}

const std::vector<ShardLayout>& ShardedOptimizer::layouts() const {
  return impl_->layouts;
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t total = 0;
  for (const auto& shard : impl_->shards) {
    total += bytes_of(shard) + bytes_of(shard.grad());
  }
  for (const auto& entry : impl_->optimizer->state()) {
    total += state_tensor_bytes(*entry.second);
  }
  return total;
}

} // namespace distributed
} // namespace lamp
