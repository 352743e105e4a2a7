#include "distributed/zero_sharding.h"

#include <torch/torch.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "distributed/on_every_rank.h"
#include "distributed/reshard.h"
#include "distributed/shard_buckets.h"
#include "lamp/distributed/sharded_optimizer.h"
#include "platform/archive.h"

namespace lamp {
namespace distributed {
namespace {

constexpr const char* kGather = "the gather of the sharded optimizer's weights";

} // namespace

namespace detail {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

ZeroSharding::ZeroSharding(std::shared_ptr<ProcessGroup> group,
                           int64_t cap_bytes, InstallShardBuckets install)
    : group_(std::move(group)),
      cap_bytes_(cap_bytes),
      install_(std::move(install)) {
  TORCH_CHECK(group_ != nullptr,
              "lamp::distributed::ShardedOptimizer: the process group is "
              "null; give ProcessGroup::from_environment()'s.");
}

void ZeroSharding::build(std::vector<torch::Tensor> params,
                         const std::vector<size_t>& groups,
                         const std::vector<std::string>& names) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(!params.empty(),
              "lamp::distributed::ShardedOptimizer: no parameters to train.");
  params_ = std::move(params);
  const int world = group_->world_size();
  const int rank = group_->rank();
  std::vector<RankSetting> settings;
  // Each tensor once: a weight tied between two modules, listed twice by
  // Module::parameters(), would be laid out twice, its gradient counted
  // twice in the clipping norm and its masters and state kept twice.
  std::unordered_map<const c10::TensorImpl*, size_t> first;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    const auto& name = names[i];
    TORCH_CHECK(p.defined() && p.is_floating_point(),
                "lamp::distributed::ShardedOptimizer: parameter ", name, " is ",
                p.defined() ? "not floating point" : "undefined",
                "; give the model's trainable parameters.");
    const auto seen = first.emplace(p.unsafeGetTensorImpl(), i);
    TORCH_CHECK(seen.second, "lamp::distributed::ShardedOptimizer: parameter ",
                name, " is parameter ", names[seen.first->second],
                " again (a weight tied between two modules, which "
                "Module::parameters() lists twice): give each parameter "
                "once, lamp::unique_parameters(*model), to the optimizer "
                "and the ShardedOptimizer.");
    TORCH_CHECK(p.device() == group_->device(),
                "lamp::distributed::ShardedOptimizer: parameter ", name,
                " is on ", p.device(), " but the group communicates on ",
                group_->device(), ".");
    TORCH_CHECK(p.is_contiguous(),
                "lamp::distributed::ShardedOptimizer: parameter ", name,
                " is not contiguous (a channels-last weight?); its elements "
                "could not be laid out by their order in memory.");
    std::ostringstream what;
    what << p.scalar_type() << " " << p.sizes() << " in param group "
         << groups[i];
    settings.emplace_back("parameter " + name, what.str());
    size_t u = 0;
    while (u < units_.size() && (units_[u].group != groups[i] ||
                                 units_[u].dtype != p.scalar_type())) {
      ++u;
    }
    if (u == units_.size()) {
      units_.emplace_back();
      units_.back().group = groups[i];
      units_.back().dtype = p.scalar_type();
    }
    units_[u].members.push_back(i);
    group_count_ = std::max(group_count_, groups[i] + 1);
  }
  group_->check_same("the parameters of the sharded optimizer", settings,
                     "Every rank must build the same model and optimizer "
                     "(the same parameters in the same param groups).");
  if (cap_bytes_ > 0) {
    split_into_runs();
  }
  for (auto& unit : units_) {
    std::vector<int64_t> numels;
    for (const auto i : unit.members) {
      numels.push_back(params_[i].numel());
    }
    unit.layout = std::make_unique<ShardLayout>(numels, world);
    const auto& layout = *unit.layout;
    unit.mine = layout.pieces(rank);
    const auto options =
        torch::TensorOptions().dtype(unit.dtype).device(group_->device());
    unit.flat = torch::zeros({layout.padded_numel()}, options);
    unit.outgoing = torch::empty({layout.shard_numel()}, options);
    // This rank's FP32 master weights, from its pieces of the parameters
    // (the padding stays zero).
    auto shard =
        torch::zeros({layout.shard_numel()}, options.dtype(torch::kFloat));
    for (const auto& piece : unit.mine) {
      shard.narrow(0, piece.shard_offset, piece.length)
          .copy_(params_[unit.members[piece.tensor]].reshape(-1).narrow(
              0, piece.tensor_offset, piece.length));
    }
    shard.set_requires_grad(true);
    shard.mutable_grad() = torch::zeros_like(shard);
    shards_.push_back(shard);
    std::ostringstream name;
    name << "the shard of param group " << unit.group << " (" << unit.dtype
         << ")";
    shard_names_.push_back(name.str());
  }
}

void ZeroSharding::shard(torch::optim::Optimizer& optimizer,
                         const std::vector<torch::Tensor>& params,
                         const std::vector<std::string>& names) {
  TORCH_CHECK(shards_.empty(),
              "lamp::distributed: the optimizer is sharded already.");
  TORCH_CHECK(optimizer.state().empty(),
              "lamp::distributed: the optimizer has state already; shard it "
              "before its first step.");
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    index.emplace(params[i].unsafeGetTensorImpl(), i);
  }
  std::vector<torch::Tensor> listed;
  std::vector<size_t> groups;
  std::vector<std::string> listed_names;
  std::vector<std::string> model_names;
  auto& param_groups = optimizer.param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    for (const auto& p : param_groups[g].params()) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(it != index.end(), "lamp::distributed: param group ", g,
                  " of the optimizer holds a tensor that is not one of the "
                  "model's trainable parameters; build the optimizer over "
                  "the parameters it is given.");
      listed.push_back(p);
      groups.push_back(g);
      listed_names.push_back("'" + names[it->second] + "'");
      model_names.push_back(names[it->second]);
    }
  }
  given_ = params;
  given_index_.clear();
  for (const auto& p : listed) {
    given_index_.push_back(index.at(p.unsafeGetTensorImpl()));
  }
  build(std::move(listed), groups, listed_names);
  model_names_ = std::move(model_names);
  group_count_ = param_groups.size();
  if (install_) {
    TORCH_CHECK(
        params_.size() == given_.size(),
        "lamp::distributed: ZeRO stage 2 "
        "reduce-scatters the gradients of the optimizer's parameters only, "
        "but ",
        given_.size() - params_.size(), " of the ", given_.size(),
        " trainable parameters are in no param group; give the optimizer "
        "every trainable parameter (or freeze the others), or use stage 1.");
    install_(shard_buckets());
  }
  for (size_t g = 0; g < param_groups.size(); ++g) {
    std::vector<torch::Tensor> mine;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].group == g) {
        mine.push_back(shards_[u]);
      }
    }
    param_groups[g].params() = std::move(mine);
  }
}

void ZeroSharding::gradients_to_shards() {
  if (cap_bytes_ > 0) {
    return; // stage 2: reduce-scattered there during the backward
  }
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = units_[u];
    auto& grad = shards_[u].mutable_grad();
    if (!grad.defined()) {
      grad = torch::zeros_like(shards_[u]);
    }
    // Every piece is written (the padding stays the zeros it was made
    // with: unscaling and clipping keep a zero zero), so no pass zeroes
    // the whole gradient first.
    for (const auto& piece : unit.mine) {
      const auto& param_grad = params_[unit.members[piece.tensor]].grad();
      auto target = grad.narrow(0, piece.shard_offset, piece.length);
      if (param_grad.defined()) {
        target.copy_(param_grad.reshape(-1).narrow(0, piece.tensor_offset,
                                                   piece.length));
      } else {
        target.zero_();
      }
    }
  }
}

void ZeroSharding::shards_to_parameters() {
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& unit = units_[u];
    unit.outgoing.copy_(shards_[u]);
    group_->all_gather_(unit.flat, unit.outgoing, kGather);
    for (size_t k = 0; k < unit.members.size(); ++k) {
      auto& p = params_[unit.members[k]];
      p.copy_(
          unit.flat.narrow(0, unit.layout->offset(k), p.numel()).view_as(p));
    }
  }
}

std::vector<torch::Tensor> ZeroSharding::gather_masters() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> result;
  for (const auto& p : given_) {
    result.push_back(p.detach().to(torch::kFloat, /*non_blocking=*/false,
                                   /*copy=*/true));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = units_[u];
    auto flat = torch::empty({unit.layout->padded_numel()},
                             shards_[u].options().requires_grad(false));
    group_->all_gather_(flat, shards_[u].detach(),
                        "the gather of the FP32 master weights");
    for (size_t k = 0; k < unit.members.size(); ++k) {
      auto& out = result[given_index_[unit.members[k]]];
      out.view(-1).copy_(flat.narrow(0, unit.layout->offset(k), out.numel()));
    }
  }
  return result;
}

void ZeroSharding::set_masters(const std::vector<torch::Tensor>& values) {
  TORCH_CHECK(values.size() == given_.size(),
              "lamp::distributed: set_masters got ", values.size(),
              " tensors for ", given_.size(), " parameters.");
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = units_[u];
    for (const auto& piece : unit.mine) {
      const auto& value = values[given_index_[unit.members[piece.tensor]]];
      TORCH_CHECK(value.numel() == params_[unit.members[piece.tensor]].numel(),
                  "lamp::distributed: set_masters got ", value.sizes(),
                  " for a parameter of ",
                  params_[unit.members[piece.tensor]].sizes(), ".");
      shards_[u]
          .narrow(0, piece.shard_offset, piece.length)
          .copy_(
              value.reshape(-1).narrow(0, piece.tensor_offset, piece.length));
    }
  }
}

void ZeroSharding::reduce_square_sum(torch::Tensor& square_sum) {
  group_->all_reduce_(square_sum, ReduceOp::kSum,
                      "the gradient norm of the sharded optimizer");
}

void ZeroSharding::save(torch::serialize::OutputArchive& archive) const {
  archive.write("world_size", c10::IValue(int64_t{group_->world_size()}));
  archive.write("rank", c10::IValue(int64_t{group_->rank()}));
  archive.write("layout", layout_tensor());
  for (size_t u = 0; u < shards_.size(); ++u) {
    archive.write("shard_" + std::to_string(u), shards_[u].detach(),
                  /*is_buffer=*/true);
  }
  if (!model_names_.empty()) {
    // The units' members in their order: with the layout, each master's
    // place in the shards (gather_saved_masters).
    c10::List<std::string> names;
    for (const auto& unit : units_) {
      for (const auto i : unit.members) {
        names.push_back(model_names_[i]);
      }
    }
    archive.write("names", c10::IValue(names));
  }
}

void ZeroSharding::check(torch::serialize::InputArchive& archive,
                         const std::string& where) const {
  const auto* caller = where.c_str();
  const auto world = lamp::detail::read_int(archive, "world_size", caller);
  const auto rank = lamp::detail::read_int(archive, "rank", caller);
  TORCH_CHECK(world == group_->world_size(), where,
              ": the optimizer state was sharded over ", world,
              world == 1 ? " rank" : " ranks", " but this run has ",
              group_->world_size(), "; resume with ", world,
              world == 1 ? " rank" : " ranks",
              ", or re-shard it: give every saved rank's archive, in rank "
              "order, to load_resharded().");
  TORCH_CHECK(rank == group_->rank(), where, ": holds rank ", rank,
              "'s shard of the optimizer state, but this is rank ",
              group_->rank(), "; give each rank its own shard.");
  torch::Tensor layout;
  TORCH_CHECK(archive.try_read("layout", layout) &&
                  layout.scalar_type() == torch::kLong &&
                  layout.sizes() == layout_tensor().sizes() &&
                  torch::equal(layout, layout_tensor()),
              where,
              ": the shards were laid out for other parameters or param "
              "groups than this model's and optimizer's; resume with the "
              "same model and optimizer settings.");
  for (size_t u = 0; u < shards_.size(); ++u) {
    lamp::detail::read_checked_tensor(archive, "shard_" + std::to_string(u),
                                      shards_[u], shard_names_[u],
                                      /*finite=*/true, caller);
  }
}

void ZeroSharding::load(torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < shards_.size(); ++u) {
    torch::Tensor saved;
    archive.read("shard_" + std::to_string(u), saved);
    shards_[u].copy_(saved);
  }
  // Every rank's parameters from the loaded shards: the model's own
  // weights in the archive are the same values, rounded to its dtype.
  shards_to_parameters();
}

void ZeroSharding::agree(const std::string& what,
                         const std::function<void()>& work) {
  on_every_rank(*group_, what, work);
}

void ZeroSharding::reshard(
    std::vector<torch::serialize::InputArchive>& shards,
    std::vector<torch::serialize::InputArchive>& optimizers,
    torch::serialize::OutputArchive& shard_out,
    torch::serialize::OutputArchive& optimizer_out,
    const std::string& where) const {
  const auto* caller = where.c_str();
  const auto saved_world = static_cast<int64_t>(shards.size());
  TORCH_CHECK(
      saved_world >= 1 && optimizers.size() == static_cast<size_t>(saved_world),
      where,
      ": re-sharding needs each saved rank's shard and "
      "optimizer state (got ",
      shards.size(), " and ", optimizers.size(), ").");
  const auto layout = layout_tensor();
  for (int64_t k = 0; k < saved_world; ++k) {
    const auto world = lamp::detail::read_int(shards[k], "world_size", caller);
    const auto rank = lamp::detail::read_int(shards[k], "rank", caller);
    TORCH_CHECK(world == saved_world && rank == k, where, ": archive ", k,
                " of ", saved_world, " holds rank ", rank, " of ", world,
                "'s shard; give every rank's archive of one checkpoint, in "
                "rank order.");
    torch::Tensor saved_layout;
    TORCH_CHECK(shards[k].try_read("layout", saved_layout) &&
                    saved_layout.scalar_type() == torch::kLong &&
                    saved_layout.sizes() == layout.sizes() &&
                    torch::equal(saved_layout, layout),
                where, ": rank ", k,
                "'s shards were laid out for other parameters or param "
                "groups than this model's and optimizer's; resume with the "
                "same model and optimizer settings.");
  }
  shard_out.write("world_size", c10::IValue(int64_t{group_->world_size()}));
  shard_out.write("rank", c10::IValue(int64_t{group_->rank()}));
  shard_out.write("layout", layout);
  std::vector<std::vector<ReshardSizes>> groups(group_count_);
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& unit = *units_[u].layout;
    const ReshardSizes sizes{unit.numel(),
                             (unit.numel() + saved_world - 1) / saved_world,
                             unit.shard_numel()};
    std::vector<torch::Tensor> pieces;
    for (int64_t k = 0; k < saved_world; ++k) {
      pieces.push_back(lamp::detail::read_checked_tensor(
          shards[k], "shard_" + std::to_string(u),
          torch::empty({sizes.old_shard},
                       shards_[u].options().requires_grad(false)),
          "rank " + std::to_string(k) + "'s " + shard_names_[u],
          /*finite=*/true, caller));
    }
    shard_out.write("shard_" + std::to_string(u),
                    reshard_flat(pieces, sizes, group_->rank()),
                    /*is_buffer=*/true);
    groups.at(units_[u].group).push_back(sizes);
  }
  reshard_optimizer(optimizers, groups, group_->rank(), optimizer_out, where);
}

void ZeroSharding::split_into_runs() {
  std::vector<Unit> runs;
  for (auto& unit : units_) {
    const auto size = static_cast<int64_t>(torch::elementSize(unit.dtype));
    std::vector<std::vector<size_t>> pieces;
    int64_t bytes = 0;
    for (size_t j = unit.members.size(); j-- > 0;) {
      const int64_t b = params_[unit.members[j]].numel() * size;
      if (pieces.empty() || (bytes > 0 && bytes + b > cap_bytes_)) {
        pieces.emplace_back();
        bytes = 0;
      }
      pieces.back().insert(pieces.back().begin(), unit.members[j]);
      bytes += b;
    }
    // In the unit's order (its first parameters first).
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      runs.emplace_back();
      runs.back().group = unit.group;
      runs.back().dtype = unit.dtype;
      runs.back().members = std::move(*it);
    }
  }
  units_ = std::move(runs);
}

std::vector<ShardBucket> ZeroSharding::shard_buckets() {
  std::vector<size_t> order(units_.size());
  std::vector<size_t> last(units_.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    order[u] = u;
    for (const auto i : units_[u].members) {
      last[u] = std::max(last[u], given_index_[i]);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return last[a] > last[b]; });
  std::vector<ShardBucket> buckets;
  for (const auto u : order) {
    const auto& unit = units_[u];
    ShardBucket bucket;
    for (size_t k = 0; k < unit.members.size(); ++k) {
      bucket.params.push_back(params_[unit.members[k]]);
      bucket.offsets.push_back(unit.layout->offset(k));
    }
    bucket.padded_numel = unit.layout->padded_numel();
    bucket.shard_numel = unit.layout->shard_numel();
    bucket.dtype = unit.dtype;
    bucket.shard_grad = shards_[u].mutable_grad();
    buckets.push_back(std::move(bucket));
  }
  return buckets;
}

int64_t ZeroSharding::bytes() const {
  int64_t total = 0;
  for (const auto& shard : shards_) {
    total += bytes_of(shard) + bytes_of(shard.grad());
  }
  return total;
}

const std::vector<ShardLayout> ZeroSharding::layouts() const {
  std::vector<ShardLayout> result;
  for (const auto& unit : units_) {
    result.push_back(*unit.layout);
  }
  return result;
}

torch::Tensor ZeroSharding::layout_tensor() const {
  std::vector<int64_t> values;
  for (const auto& unit : units_) {
    values.push_back(static_cast<int64_t>(unit.group));
    values.push_back(static_cast<int64_t>(unit.dtype));
    values.push_back(static_cast<int64_t>(unit.members.size()));
    for (const auto i : unit.members) {
      values.push_back(params_[i].numel());
    }
  }
  return torch::tensor(values, torch::kLong);
}

} // namespace detail

std::unique_ptr<OptimizerSharding> optimizer_sharding(
    std::shared_ptr<ProcessGroup> group) {
  return std::make_unique<detail::ZeroSharding>(std::move(group));
}

namespace detail {

std::unique_ptr<OptimizerSharding> stage2_sharding(
    std::shared_ptr<ProcessGroup> group, int64_t cap_bytes,
    InstallShardBuckets install) {
  TORCH_CHECK(cap_bytes > 0,
              "lamp::distributed: the bucket cap of ZeRO "
              "stage 2 must be positive.");
  return std::make_unique<ZeroSharding>(std::move(group), cap_bytes,
                                        std::move(install));
}

} // namespace detail
} // namespace distributed
} // namespace lamp
