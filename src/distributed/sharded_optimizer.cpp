#include "lamp/distributed/sharded_optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distributed/on_every_rank.h"
#include "distributed/zero_sharding.h"
#include "lamp/optim/clip.h"
#include "optim/state_snapshot.h"
#include "platform/archive.h"

namespace lamp {
namespace distributed {
namespace {

using detail::bytes_of;

constexpr const char* kLoadCaller = "lamp::distributed::ShardedOptimizer::load";
constexpr const char* kReshardCaller =
    "lamp::distributed::ShardedOptimizer::load_resharded";

// "0", "1", ...: the parameters' names in messages (ShardedOptimizer is
// given tensors, not a model's named parameters).
std::vector<std::string> index_names(size_t count) {
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    names.push_back(std::to_string(i));
  }
  return names;
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

// For the lifetime of one call, the scaler's found-inf reduction is the
// maximum over the group's ranks: each rank checks its own shard of the
// gradients, and every rank must skip where any found an inf/NaN.
class RanksAgreeOnOverflow {
 public:
  RanksAgreeOnOverflow(GradScaler& scaler,
                       const GradScaler::FoundInfReduction& reduction)
      : scaler_(scaler), previous_(scaler.found_inf_reduction()) {
    scaler_.set_found_inf_reduction(reduction);
  }
  ~RanksAgreeOnOverflow() { scaler_.set_found_inf_reduction(previous_); }
  RanksAgreeOnOverflow(const RanksAgreeOnOverflow&) = delete;
  RanksAgreeOnOverflow& operator=(const RanksAgreeOnOverflow&) = delete;

 private:
  GradScaler& scaler_;
  GradScaler::FoundInfReduction previous_;
};

} // namespace

struct ShardedOptimizer::Impl {
  explicit Impl(std::shared_ptr<ProcessGroup> process_group)
      : group(process_group), shards(std::move(process_group)) {}
  std::shared_ptr<ProcessGroup> group;
  detail::ZeroSharding shards;
  // The maximum of a found-inf flag over the ranks (null for one process).
  GradScaler::FoundInfReduction overflow_reduction = found_inf_reduction(group);
  // Whether the shards hold this step's gradients (unscale_() or
  // clip_grad_norm_() copied them before step()).
  bool gradients_copied = false;
  std::vector<torch::Tensor> params;
  std::vector<ShardLayout> layouts;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  void copy_gradients() {
    if (!gradients_copied) {
      shards.gradients_to_shards();
      gradients_copied = true;
    }
  }
};

ShardedOptimizer::ShardedOptimizer(std::vector<torch::Tensor> params,
                                   Factory make_optimizer,
                                   std::shared_ptr<ProcessGroup> group)
    : impl_(std::make_unique<Impl>(std::move(group))) {
  TORCH_CHECK(make_optimizer != nullptr,
              "lamp::distributed::ShardedOptimizer: no optimizer factory.");
  auto& impl = *impl_;
  impl.params = params;
  const auto names = index_names(params.size());
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
              "set of options for every parameter). For param groups, build "
              "the optimizer over the parameters and pass it instead of a "
              "factory.");
}

ShardedOptimizer::ShardedOptimizer(
    std::vector<torch::Tensor> params,
    std::unique_ptr<torch::optim::Optimizer> optimizer,
    std::shared_ptr<ProcessGroup> group)
    : impl_(std::make_unique<Impl>(std::move(group))) {
  TORCH_CHECK(optimizer != nullptr,
              "lamp::distributed::ShardedOptimizer: the optimizer is null.");
  auto& impl = *impl_;
  impl.params = params;
  impl.shards.shard(*optimizer, params, index_names(params.size()));
  impl.layouts = impl.shards.layouts();
  impl.optimizer = std::move(optimizer);
}

ShardedOptimizer::~ShardedOptimizer() = default;

void ShardedOptimizer::step() {
  auto& impl = *impl_;
  impl.copy_gradients();
  {
    torch::NoGradGuard no_grad;
    impl.optimizer->step();
  }
  impl.gradients_copied = false;
  impl.shards.shards_to_parameters();
}

bool ShardedOptimizer::step(GradScaler& scaler) {
  auto& impl = *impl_;
  impl.copy_gradients();
  bool stepped = false;
  {
    RanksAgreeOnOverflow agree(scaler, impl.overflow_reduction);
    torch::NoGradGuard no_grad;
    stepped = scaler.step(*impl.optimizer);
  }
  impl.gradients_copied = false;
  // Every rank stepped or every rank skipped: a skipped step changed no
  // shard, and so no parameter.
  if (stepped) {
    impl.shards.shards_to_parameters();
  }
  return stepped;
}

void ShardedOptimizer::unscale_(GradScaler& scaler) {
  auto& impl = *impl_;
  impl.copy_gradients();
  RanksAgreeOnOverflow agree(scaler, impl.overflow_reduction);
  torch::NoGradGuard no_grad;
  scaler.unscale_(*impl.optimizer);
}

torch::Tensor ShardedOptimizer::clip_grad_norm_(double max_norm) {
  auto& impl = *impl_;
  impl.copy_gradients();
  return optim::clip_grad_norm_(impl.shards.shards(), max_norm,
                                [&impl](torch::Tensor& square_sum) {
                                  impl.shards.reduce_square_sum(square_sum);
                                });
}

void ShardedOptimizer::zero_grad() {
  for (auto& p : impl_->params) {
    p.mutable_grad() = torch::Tensor();
  }
  impl_->gradients_copied = false;
}

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  const auto& impl = *impl_;
  torch::serialize::OutputArchive shard_archive;
  impl.shards.save(shard_archive);
  archive.write("optimizer_shard", shard_archive);
  torch::serialize::OutputArchive optimizer_archive;
  impl.optimizer->save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  auto& impl = *impl_;
  torch::serialize::InputArchive shard_archive;
  torch::serialize::InputArchive optimizer_archive;
  // Every rank loads or none does: the parameters' gather below is a
  // collective that a refusing rank would leave the others waiting in.
  detail::on_every_rank(
      *impl.group, "checking the sharded optimizer's archive", [&] {
        lamp::detail::read_archive(archive, "optimizer_shard", shard_archive,
                                   kLoadCaller);
        // The world size and rank first: another's shards have other shapes.
        impl.shards.check(shard_archive, kLoadCaller);
        lamp::detail::read_archive(archive, "optimizer", optimizer_archive,
                                   kLoadCaller);
        std::unordered_map<const c10::TensorImpl*, std::string> names;
        const auto& shards = impl.shards.shards();
        for (size_t u = 0; u < shards.size(); ++u) {
          names.emplace(shards[u].unsafeGetTensorImpl(),
                        impl.shards.shard_names()[u]);
        }
        lamp::detail::check_optimizer_archive(
            *impl.optimizer, optimizer_archive, names, kLoadCaller);
      });
  // The optimizer first: what its load may still refuse (an option of the
  // wrong type, an optimizer of one's own) it refuses before the shards
  // change, and what it had changed is put back, on every rank when it
  // failed on any.
  optim::internal::StateSnapshot snapshot(*impl.optimizer);
  try {
    detail::on_every_rank(*impl.group, "loading the optimizer's state",
                          [&] { impl.optimizer->load(optimizer_archive); });
  } catch (...) {
    snapshot.restore();
    throw;
  }
  impl.shards.load(shard_archive);
}

void ShardedOptimizer::load_resharded(
    std::vector<torch::serialize::InputArchive>& every_rank) {
  auto& impl = *impl_;
  torch::serialize::OutputArchive mine;
  // Every rank re-shards before any loads: each reads every archive, and
  // one may fail where the others do not.
  detail::on_every_rank(
      *impl.group, "re-sharding the sharded optimizer's archives", [&] {
        TORCH_CHECK(!every_rank.empty(), kReshardCaller,
                    ": no archives given; pass what every rank of the saved "
                    "run wrote, in rank order.");
        std::vector<torch::serialize::InputArchive> shards(every_rank.size());
        std::vector<torch::serialize::InputArchive> optimizers(
            every_rank.size());
        for (size_t k = 0; k < every_rank.size(); ++k) {
          TORCH_CHECK(every_rank[k].try_read("optimizer_shard", shards[k]) &&
                          every_rank[k].try_read("optimizer", optimizers[k]),
                      kReshardCaller, ": archive ", k,
                      " is not a sharded optimizer's (it has no "
                      "'optimizer_shard' and 'optimizer' sections); give "
                      "what ShardedOptimizer::save() wrote on each rank.");
        }
        torch::serialize::OutputArchive shard_out;
        torch::serialize::OutputArchive optimizer_out;
        impl.shards.reshard(shards, optimizers, shard_out, optimizer_out,
                            kReshardCaller);
        mine.write("optimizer_shard", shard_out);
        mine.write("optimizer", optimizer_out);
      });
  // What this rank would have saved in their run: load()'s checks and its
  // all-or-nothing load.
  auto archive = lamp::detail::reread(mine);
  load(archive);
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
