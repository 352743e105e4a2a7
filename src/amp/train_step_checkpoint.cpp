#include "lamp/amp/train_step.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "amp/graph_step.h"
#include "optim/state_snapshot.h"
#include "platform/archive.h"

// TrainStep's checkpoint: save() and the all-or-nothing load().

namespace lamp {

void TrainStep::save(torch::serialize::OutputArchive& archive) const {
  TORCH_CHECK(
      micro_step_ == 0, "lamp::TrainStep::save: called after ", micro_step_,
      " of ", options_.accumulation_steps(),
      " accumulated micro-batches; the partial gradients would be lost. Save after the step() that ends the cycle.");
  archive.write("precision", c10::IValue(to_string(options_.precision())));
  torch::serialize::OutputArchive model_archive;
  model_->save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer_->save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  torch::serialize::OutputArchive scaler_archive;
  scaler_.save(scaler_archive);
  archive.write("scaler", scaler_archive);
  if (master_) {
    torch::serialize::OutputArchive master_archive;
    master_->save(master_archive);
    archive.write("master_weights", master_archive);
  }
  if (sharding_) {
    torch::serialize::OutputArchive shard_archive;
    sharding_->save(shard_archive);
    archive.write("optimizer_shard", shard_archive);
  }
  if (float8_) {
    torch::serialize::OutputArchive float8_archive;
    nn::save_float8_state(*model_, float8_archive);
    archive.write("float8", float8_archive);
  }
}

namespace {
constexpr const char* kLoadCaller = "lamp::TrainStep::load";
} // namespace

void TrainStep::load(torch::serialize::InputArchive& archive) {
  detail::InUseGuard in_use(in_use_, kLoadCaller);
  // Every part is read and checked before the first is loaded: a refused
  // checkpoint leaves model, optimizer, scaler and master weights as they
  // were.
  torch::serialize::InputArchive shard_archive;
  torch::serialize::InputArchive model_archive;
  torch::serialize::InputArchive optimizer_archive;
  torch::serialize::InputArchive scaler_archive;
  torch::serialize::InputArchive master_archive;
  torch::serialize::InputArchive float8_archive;
  bool load_scaler = false;
  const auto check = [&] {
    const auto precision =
        detail::read_string(archive, "precision", kLoadCaller);
    TORCH_CHECK(precision == to_string(options_.precision()),
                "lamp::TrainStep::load: the checkpoint was saved with "
                "precision '",
                precision, "' but this TrainStep uses '",
                to_string(options_.precision()),
                "'; resume with the same precision.");
    const bool sharded = archive.try_read("optimizer_shard", shard_archive);
    TORCH_CHECK(
        sharded == (sharding_ != nullptr), kLoadCaller,
        ": the checkpoint holds the optimizer state ",
        sharded ? "of one rank's shard (ZeRO)" : "whole",
        " but this TrainStep keeps it ",
        sharding_ ? "sharded (DataParallelOptions::zero_stage 1)" : "whole",
        "; resume with the same zero_stage.");
    if (sharding_) {
      // The world size and rank first: another's shards have other shapes.
      sharding_->check(shard_archive, kLoadCaller);
    }
    detail::read_archive(archive, "model", model_archive, kLoadCaller);
    detail::check_module_archive(*model_, model_archive, "", kLoadCaller);
    detail::read_archive(archive, "optimizer", optimizer_archive, kLoadCaller);
    detail::check_optimizer_archive(*optimizer_, optimizer_archive,
                                    param_names_, kLoadCaller);
    detail::read_archive(archive, "scaler", scaler_archive, kLoadCaller);
    // A step without loss scaling saved with skip_non_finite off (lamp
    // 0.3's default) has an empty scaler section; the skip-only scaler (a
    // static scale of 1) then has nothing to restore.
    c10::IValue saved_scale;
    load_scaler = scaler_archive.try_read("scale", saved_scale) ||
                  policy_.loss_scaling || options_.force_loss_scaling();
    if (load_scaler) {
      // A scaler with the same options runs all of load()'s checks.
      GradScaler(scaler_.options()).load(scaler_archive);
    }
    if (master_) {
      detail::read_archive(archive, "master_weights", master_archive,
                           kLoadCaller);
      master_->read(master_archive);
    }
    const bool has_float8 = archive.try_read("float8", float8_archive);
    TORCH_CHECK(has_float8 == float8_, kLoadCaller, ": the checkpoint ",
                has_float8 ? "has" : "has no",
                " FP8 scaling state but this TrainStep's model ",
                float8_ ? "has" : "has no",
                " FP8 layers; resume with the same TrainStepOptions::float8.");
    if (float8_) {
      nn::check_float8_state(*model_, float8_archive);
    }
  };
  if (sharding_) {
    // Every rank checks its archive before any loads: the load ends in a
    // gather of the shards, which a rank that refused alone would leave
    // the others waiting in.
    sharding_->agree("checking the checkpoint", check);
  } else {
    check();
  }

  // Captured graphs hold the old parameters' and state's memory: each shape
  // warms up and is captured again after a load.
  if (graphs_) {
    graphs_->clear();
  }
  micro_step_ = 0;
  // The optimizer first: what its load may still refuse (an option of the
  // wrong type, an optimizer of one's own) it refuses before anything else
  // changes, and what it had changed is put back. A sharded step's ranks
  // agree on it: a load that failed on one rank alone would leave that
  // rank's state as it was and the others' loaded, and them waiting in the
  // gather of the shards below.
  optim::internal::StateSnapshot snapshot(*optimizer_);
  const auto load_optimizer = [&] { optimizer_->load(optimizer_archive); };
  try {
    if (sharding_) {
      sharding_->agree("loading the optimizer's state", load_optimizer);
    } else {
      load_optimizer();
    }
  } catch (...) {
    snapshot.restore();
    throw;
  }
  model_->load(model_archive);
  if (load_scaler) {
    scaler_.load(scaler_archive);
  }
  if (master_) {
    master_->load(master_archive);
  }
  if (sharding_) {
    sharding_->load(shard_archive);
  }
  if (float8_) {
    nn::load_float8_state(*model_, float8_archive);
  }
}

void TrainStep::load_resharded(
    std::vector<torch::serialize::InputArchive>& every_rank) {
  constexpr const char* kCaller = "lamp::TrainStep::load_resharded";
  TORCH_CHECK(sharding_ != nullptr, kCaller,
              ": this TrainStep keeps the optimizer state whole; re-sharding "
              "is for a step with DataParallelOptions::zero_stage 1. Use "
              "load() with the checkpoint of a whole run.");
  torch::serialize::OutputArchive mine;
  // Every rank re-shards before any loads (each reads every archive; one
  // may fail where the others do not).
  sharding_->agree("re-sharding the checkpoint", [&] {
    TORCH_CHECK(!every_rank.empty(), kCaller,
                ": no archives given; pass what every rank of the saved run "
                "wrote, in rank order.");
    std::vector<torch::serialize::InputArchive> shards(every_rank.size());
    std::vector<torch::serialize::InputArchive> optimizers(every_rank.size());
    for (size_t k = 0; k < every_rank.size(); ++k) {
      TORCH_CHECK(every_rank[k].try_read("optimizer_shard", shards[k]), kCaller,
                  ": archive ", k,
                  " holds the optimizer state whole, not one rank's shard; "
                  "resume it with load() and zero_stage 0.");
      detail::read_archive(every_rank[k], "optimizer", optimizers[k], kCaller);
    }
    torch::serialize::OutputArchive shard_out;
    torch::serialize::OutputArchive optimizer_out;
    sharding_->reshard(shards, optimizers, shard_out, optimizer_out, kCaller);
    // Rank 0's archive with this rank's shard and optimizer state in place
    // of its own, then the checked, all-or-nothing load().
    detail::copy_archive(every_rank[0], mine, {"optimizer", "optimizer_shard"});
    mine.write("optimizer", optimizer_out);
    mine.write("optimizer_shard", shard_out);
  });
  auto archive = detail::reread(mine);
  load(archive);
}

} // namespace lamp
