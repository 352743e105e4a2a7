#include "lamp/training/checkpoint_weights.h"

#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distributed/reshard.h"
#include "lamp/amp/master_weights.h"
#include "lamp/platform/checkpoint_file.h"
#include "platform/archive.h"
#include "platform/paths.h"
#include "training/run_settings.h"
#include "training/shard_files.h"

namespace lamp {
namespace training {
namespace {

constexpr const char* kCaller = "lamp::training::load_weights_from_checkpoint";
// The differences an error lists before "and N more".
constexpr size_t kListed = 5;

// The tensors of a Module::save() archive by dotted name, in the order they
// were written (each module's parameters, its buffers, then its children).
// Values that are neither tensors nor modules (none today) are passed over.
void flatten(torch::serialize::InputArchive& archive, const std::string& prefix,
             torch::OrderedDict<std::string, torch::Tensor>& out,
             const char* where) {
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    if (!archive.try_read(key, value)) {
      continue;
    }
    if (value.isTensor()) {
      out.insert(prefix + key, value.toTensor());
    } else if (value.isObject()) {
      torch::serialize::InputArchive child;
      lamp::detail::read_archive(archive, key, child, where);
      flatten(child, prefix + key + ".", out, where);
    }
  }
}

// The master weights the run saved, by parameter name (TrainStep names them).
std::unordered_map<std::string, torch::Tensor> read_masters(
    torch::serialize::InputArchive& step_archive, const char* where) {
  std::unordered_map<std::string, torch::Tensor> masters;
  torch::serialize::InputArchive archive;
  if (!step_archive.try_read("master_weights", archive)) {
    return masters; // a run without master weights (fp32, tf32, amp)
  }
  const auto keyed_by = lamp::detail::read_string(archive, "keyed_by", where);
  TORCH_CHECK(keyed_by == "name", where, ": the master weights are keyed by '",
              keyed_by, "', not by name; the checkpoint is damaged.");
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    if (archive.try_read(key, value) && value.isTensor()) {
      masters.emplace(key, value.toTensor());
    }
  }
  return masters;
}

std::string shape(const torch::Tensor& tensor) {
  return c10::str(tensor.sizes());
}

// Whether a model's saved tensors hold FP16 or BF16 parameters (a half or
// bf16 run, whose FP32 masters are kept apart from them).
bool holds_half_weights(
    const torch::OrderedDict<std::string, torch::Tensor>& saved) {
  for (const auto& item : saved) {
    const auto dtype = item.value().scalar_type();
    if (dtype == torch::kHalf || dtype == torch::kBFloat16) {
      return true;
    }
  }
  return false;
}

// The FP32 masters of a sharded checkpoint (`archive`, the manifest at
// `path`, whose train_step is `step_archive` and list of shard files
// `shards`), gathered from every saved rank's shard, by parameter name and
// in the shape of `saved`'s tensor of that name. Throws when a shard file is
// missing, another's or damaged, or its shards were written before they
// named their parameters.
std::unordered_map<std::string, torch::Tensor> read_sharded_masters(
    torch::serialize::InputArchive& archive,
    torch::serialize::InputArchive& step_archive, const c10::IValue& shards,
    const torch::OrderedDict<std::string, torch::Tensor>& saved,
    const std::string& path, const std::string& model_name) {
  const std::string where = "lamp: " + path;
  TORCH_CHECK(shards.isList(), where,
              ": the manifest's list of shard files is damaged.");
  const auto saved_world = static_cast<int64_t>(shards.toListRef().size()) + 1;
  const auto global_step =
      lamp::detail::read_int(archive, "global_step", where.c_str());
  const auto checksums = detail::shard_checksums(archive, path, saved_world);
  std::vector<torch::serialize::InputArchive> optimizer_shards(saved_world);
  for (int64_t k = 0; k < saved_world; ++k) {
    torch::serialize::InputArchive train_step;
    auto* step = &step_archive;
    if (k > 0) {
      detail::read_shard(path, shards.toListRef()[k - 1], k, saved_world,
                         global_step, checksums[k], model_name, train_step);
      step = &train_step;
    }
    lamp::detail::read_archive(*step, "optimizer_shard", optimizer_shards[k],
                               where.c_str());
  }
  const auto gathered =
      distributed::detail::gather_saved_masters(optimizer_shards, where);
  TORCH_CHECK(!gathered.empty(), where,
              ": its shards were written before they named their parameters.");
  std::unordered_map<std::string, torch::Tensor> masters;
  for (const auto& item : gathered) {
    const auto* tensor = saved.find(item.first);
    TORCH_CHECK(tensor != nullptr && tensor->numel() == item.second.numel(),
                where, ": the shards hold a master weight of ",
                item.second.numel(), " elements for '", item.first, "', ",
                tensor == nullptr ? std::string("which the model lacks")
                                  : "a parameter of " + shape(*tensor),
                "; the checkpoint is damaged.");
    masters.emplace(item.first, item.second.view(tensor->sizes()));
  }
  return masters;
}

// The checkpoint at `path` read into `archive`, its checksum and format
// checked; `purpose` ends the message for a missing file ("to resume from").
void read_trainer_checkpoint(const std::string& path, const char* purpose,
                             torch::serialize::InputArchive& archive) {
  TORCH_CHECK(lamp::detail::path_kind(path) != lamp::detail::PathKind::kMissing,
              "lamp: no checkpoint at ", path, " ", purpose, ".");
  load_checked_archive(archive, path);
  const auto where = "lamp: " + path;
  const auto format =
      lamp::detail::read_string(archive, "format", where.c_str());
  TORCH_CHECK(format == detail::kCheckpointFormat, "lamp: ", path, " is a '",
              format, "' checkpoint, not one of lamp's trainer ('",
              detail::kCheckpointFormat, "').");
}

} // namespace

CheckpointSettings read_checkpoint_settings(const std::string& path) {
  torch::serialize::InputArchive archive;
  read_trainer_checkpoint(path, "to resume from", archive);
  const std::string where = "lamp: " + path;
  CheckpointSettings settings;
  settings.path = path;
  settings.model_name =
      lamp::detail::read_string(archive, "model_name", where.c_str());
  settings.epochs_done =
      lamp::detail::read_int(archive, "next_epoch", where.c_str());
  settings.settings = detail::read_stored_settings(archive, path);
  settings.program_settings = detail::read_program_settings(archive, path);
  settings.global_step =
      lamp::detail::read_int(archive, "global_step", where.c_str());
  return settings;
}

CheckpointWeights read_checkpoint_weights(const std::string& path) {
  torch::serialize::InputArchive archive;
  read_trainer_checkpoint(path, "to load weights from", archive);
  const std::string where_text = "lamp: " + path;
  const char* where = where_text.c_str();
  CheckpointWeights weights;
  weights.path = path;
  weights.model_name = lamp::detail::read_string(archive, "model_name", where);
  weights.epochs_done = lamp::detail::read_int(archive, "next_epoch", where);
  weights.history = detail::read_history(archive, path);
  torch::serialize::InputArchive step_archive;
  lamp::detail::read_archive(archive, "train_step", step_archive, where);
  torch::serialize::InputArchive model_archive;
  lamp::detail::read_archive(step_archive, "model", model_archive, where);
  torch::OrderedDict<std::string, torch::Tensor> saved;
  flatten(model_archive, "", saved, where);
  auto masters = read_masters(step_archive, where);
  c10::IValue shards;
  if (masters.empty() && archive.try_read("zero_shards", shards) &&
      holds_half_weights(saved)) {
    // ZeRO keeps each rank's part of the FP32 masters in that rank's shard
    // file, as flat optimizer state: they are read back whole from there.
    try {
      masters = read_sharded_masters(archive, step_archive, shards, saved, path,
                                     weights.model_name);
    } catch (const c10::Error& e) {
      TORCH_WARN("lamp: ", path,
                 " is a checkpoint of a run with sharded optimizer state "
                 "(ZeRO), whose FP32 master weights are in its ranks' shard "
                 "files, and they could not be read: ",
                 e.what_without_backtrace(),
                 " The weights read from it are the model's FP16/BF16 copy, "
                 "the masters rounded; give the checkpoint with its .rank* "
                 "files to start from the masters themselves.");
      masters.clear();
    }
  }
  for (const auto& item : saved) {
    const auto master = masters.find(item.key());
    const auto& value = master != masters.end() ? master->second : item.value();
    if (master != masters.end()) {
      TORCH_CHECK(master->second.sizes() == item.value().sizes(),
                  "lamp: ", path, ": the master weight of '", item.key(),
                  "' has shape ", shape(master->second), " but the parameter ",
                  shape(item.value()), "; the checkpoint is damaged.");
    }
    weights.tensors.insert(item.key(), value.detach().to(torch::kCPU));
  }
  return weights;
}

void load_weights_from_checkpoint(torch::nn::Module& model,
                                  const CheckpointWeights& weights,
                                  MasterWeights* master) {
  // Every tensor of the model, in its order; every difference, listed.
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (const auto& item : model.named_parameters()) {
    if (item.value().defined()) {
      targets.emplace_back(item.key(), item.value());
    }
  }
  for (const auto& item : model.named_buffers()) {
    if (item.value().defined()) {
      targets.emplace_back(item.key(), item.value());
    }
  }
  std::vector<std::string> differences;
  std::unordered_map<std::string, bool> in_model;
  for (const auto& target : targets) {
    in_model.emplace(target.first, true);
    const auto* saved = weights.tensors.find(target.first);
    if (saved == nullptr) {
      differences.push_back("'" + target.first + "' " + shape(target.second) +
                            " is not in the checkpoint");
    } else if (saved->sizes() != target.second.sizes()) {
      differences.push_back("'" + target.first + "' is " + shape(*saved) +
                            " there but " + shape(target.second) + " here");
    }
  }
  for (const auto& item : weights.tensors) {
    if (in_model.count(item.key()) == 0) {
      differences.push_back("'" + item.key() + "' " + shape(item.value()) +
                            " is not in this model");
    }
  }
  if (!differences.empty()) {
    std::string listed;
    for (size_t i = 0; i < differences.size() && i < kListed; ++i) {
      listed += (i == 0 ? "" : "; ") + differences[i];
    }
    if (differences.size() > kListed) {
      listed +=
          "; and " + std::to_string(differences.size() - kListed) + " more";
    }
    TORCH_CHECK(
        false, "lamp: ", weights.path, " holds the weights of another ",
        "model ('", weights.model_name, "', ", weights.tensors.size(),
        " tensors) than this one (", targets.size(), " tensors): ", listed,
        ". Start from a checkpoint of this model: the same architecture "
        "and sizes (an image model built for data of the same channels and "
        "classes).");
  }
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> master_of;
  if (master != nullptr) {
    const auto& models = master->model_params();
    const auto& masters = master->master_params();
    for (size_t i = 0; i < models.size() && i < masters.size(); ++i) {
      master_of.emplace(models[i].unsafeGetTensorImpl(), masters[i]);
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& target : targets) {
    const auto& saved = weights.tensors[target.first];
    target.second.copy_(saved);
    const auto found = master_of.find(target.second.unsafeGetTensorImpl());
    if (found != master_of.end()) {
      found->second.copy_(saved);
    }
  }
}

void load_weights_from_checkpoint(torch::nn::Module& model,
                                  const std::string& path,
                                  MasterWeights* master) {
  load_weights_from_checkpoint(model, read_checkpoint_weights(path), master);
}

} // namespace training
} // namespace lamp
