#include "lamp/distributed/data_parallel.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "distributed/shard_buckets.h"
#include "lamp/distributed/sharded_optimizer.h"
#include "lamp/platform/parameters.h"
#include "platform/compat.h"

namespace lamp {
namespace distributed {

namespace {

// "float [32, 1, 3, 3]", and whether it is trained, for comparing models
// across ranks.
std::string describe(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << " " << t.sizes()
      << (t.requires_grad() ? ", trained" : "");
  return out.str();
}

// What every rank's DataParallel must have the same of: the options, then
// each parameter and buffer by name.
std::vector<RankSetting> model_settings(const torch::nn::Module& model,
                                        const DataParallelOptions& options) {
  std::ostringstream cap;
  cap << options.bucket_cap_mb();
  std::vector<RankSetting> settings = {
      {"DataParallelOptions::bucket_cap_mb", cap.str()},
      {"DataParallelOptions::broadcast_buffers",
       options.broadcast_buffers() ? "true" : "false"},
      {"DataParallelOptions::communication_dtype",
       options.communication_dtype()
           ? c10::toString(*options.communication_dtype())
           : "(the gradients' own)"},
      {"DataParallelOptions::zero_stage",
       std::to_string(options.zero_stage())}};
  for (const auto& p : model.named_parameters()) {
    settings.emplace_back("parameter " + p.key(), describe(p.value()));
  }
  for (const auto& b : model.named_buffers()) {
    settings.emplace_back("buffer " + b.key(), describe(b.value()));
  }
  return settings;
}

// The constructor has checked that bucket_cap_mb fits.
int64_t bucket_cap_bytes(const DataParallelOptions& options) {
  return static_cast<int64_t>(options.bucket_cap_mb() * 1024.0 * 1024.0);
}

} // namespace

struct DataParallel::Impl {
  // A bucket's parameters and their flat communication buffer.
  struct Bucket {
    std::vector<size_t> params;   // indices into Impl::params
    std::vector<int64_t> offsets; // element offset of each in `buffer`
    torch::Tensor buffer;         // flat, in the communication dtype
    int64_t pending = 0;          // parameters not yet ready in this backward
    std::unique_ptr<ProcessGroup::Work> work;
    // How a wait report names its all-reduce; made once, not every step.
    std::string name;
    // ZeRO stage 2 (use_shard_buckets): `buffer` is made when the backward
    // first writes to it and freed after its reduce-scatter into `shard_out`
    // (this rank's part, `dtype`), which the sync copies into `shard_grad`.
    int64_t padded_numel = 0;
    int64_t numel = 0; // the parameters' elements; the padding follows
    torch::Dtype dtype = torch::kFloat;
    torch::Tensor shard_out;
    torch::Tensor shard_grad;
  };

  std::shared_ptr<ProcessGroup> group;
  DataParallelOptions options;
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> buffers;
  // One flat staging tensor per buffer dtype, made once: the per-step
  // broadcast then allocates nothing.
  struct BufferGroup {
    torch::Tensor flat;
    std::vector<torch::Tensor> members;
  };
  std::vector<BufferGroup> buffer_groups;
  std::vector<size_t> bucket_of;  // per parameter
  std::vector<int64_t> offset_of; // per parameter, within its bucket
  std::vector<bool> ready;        // per parameter, in this backward
  std::vector<Bucket> buckets;
  std::vector<lamp::detail::AutogradNodePtr> accumulators;
  size_t next_bucket = 0;
  bool sync = true;
  bool shard_buckets = false; // ZeRO stage 2
  std::mutex mutex;

  void launch(Bucket& bucket) {
    // Averaged before the sum (DDP and the compress hooks divide first).
    bucket.buffer.div_(group->world_size());
    bucket.work = shard_buckets
                      ? group->reduce_scatter_async_(bucket.shard_out,
                                                     bucket.buffer, bucket.name)
                      : group->all_reduce_async_(bucket.buffer, bucket.name);
  }

  // Stage 2: the buffer for this backward. Every parameter's slice is
  // written (its gradient, or zeros), so only the padding is zeroed here.
  static void make_buffer(Bucket& bucket, const torch::Device& device) {
    if (!bucket.buffer.defined()) {
      bucket.buffer = torch::empty(
          {bucket.padded_numel},
          torch::TensorOptions().dtype(bucket.dtype).device(device));
      bucket.buffer.narrow(0, bucket.numel, bucket.padded_numel - bucket.numel)
          .zero_();
    }
  }

  void use_shard_buckets(std::vector<detail::ShardBucket> specs) {
    std::lock_guard<std::mutex> lock(mutex);
    std::unordered_map<const c10::TensorImpl*, size_t> index;
    for (size_t k = 0; k < params.size(); ++k) {
      index.emplace(params[k].unsafeGetTensorImpl(), k);
    }
    std::vector<bool> covered(params.size(), false);
    std::vector<Bucket> made(specs.size());
    for (size_t b = 0; b < specs.size(); ++b) {
      const auto& spec = specs[b];
      auto& bucket = made[b];
      for (size_t j = 0; j < spec.params.size(); ++j) {
        const auto it = index.find(spec.params[j].unsafeGetTensorImpl());
        TORCH_CHECK(it != index.end() && !covered[it->second],
                    "lamp::distributed::DataParallel: the sharded optimizer "
                    "holds a tensor that is not one of the model's trainable "
                    "parameters (or holds one twice).");
        const size_t k = it->second;
        covered[k] = true;
        bucket.params.push_back(k);
        bucket.offsets.push_back(spec.offsets[j]);
        bucket_of[k] = b;
        offset_of[k] = spec.offsets[j];
      }
      bucket.padded_numel = spec.padded_numel;
      bucket.numel = spec.offsets.back() + spec.params.back().numel();
      bucket.dtype = spec.dtype;
      // FP32 parameters: reduce-scattered into the shard gradient itself.
      bucket.shard_out =
          spec.dtype == torch::kFloat
              ? spec.shard_grad
              : torch::empty({spec.shard_numel}, torch::TensorOptions()
                                                     .dtype(spec.dtype)
                                                     .device(group->device()));
      bucket.shard_grad = spec.shard_grad;
      bucket.name = "the gradient reduce-scatter of bucket " +
                    std::to_string(b + 1) + " of " +
                    std::to_string(specs.size());
    }
    for (size_t k = 0; k < params.size(); ++k) {
      TORCH_CHECK(covered[k],
                  "lamp::distributed::DataParallel: ZeRO stage 2 reduces the "
                  "gradients of the optimizer's parameters only; give the "
                  "optimizer every trainable parameter, or use stage 1.");
    }
    buckets = std::move(made);
    shard_buckets = true;
    reset();
  }

  // Buckets start in index order on every rank (Gloo and NCCL need the same
  // collective order everywhere), each as soon as it and those before it
  // are full.
  void launch_ready_buckets() {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      launch(buckets[next_bucket]);
      ++next_bucket;
    }
  }

  void mark_ready(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) {
      return;
    }
    auto& bucket = buckets[bucket_of[index]];
    TORCH_CHECK(
        !bucket.work, "lamp::distributed::DataParallel: parameter ", index,
        " received a second gradient after its bucket's all-reduce had started. Call backward once per step (or set_sync(false) for all but the last of several).");
    if (shard_buckets) {
      make_buffer(bucket, group->device());
    }
    auto& grad = params[index].mutable_grad();
    auto slice =
        bucket.buffer.narrow(0, offset_of[index], params[index].numel());
    if (grad.defined()) {
      slice.copy_(grad.reshape(-1));
      if (shard_buckets) {
        // Stage 2 keeps no whole gradient: the bucket has it now.
        grad = torch::Tensor();
      }
    } else {
      slice.zero_();
    }
    if (!ready[index]) {
      ready[index] = true;
      --bucket.pending;
    }
    launch_ready_buckets();
  }

  void reset() {
    std::fill(ready.begin(), ready.end(), false);
    for (auto& bucket : buckets) {
      bucket.pending = static_cast<int64_t>(bucket.params.size());
      bucket.work.reset();
    }
    next_bucket = 0;
  }
};

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> model,
                           std::shared_ptr<ProcessGroup> group,
                           DataParallelOptions options)
    : impl_(std::make_shared<Impl>()),
      group_(std::move(group)),
      reduce_found_inf_(found_inf_reduction(group_)) {
  TORCH_CHECK(model != nullptr,
              "lamp::distributed::DataParallel: the model is null.");
  TORCH_CHECK(group_ != nullptr,
              "lamp::distributed::DataParallel: the process group is null.");
  // NaN fails every comparison; inf and anything near 2^43 MiB would
  // overflow bucket_cap_bytes()'s int64_t.
  TORCH_CHECK(
      std::isfinite(options.bucket_cap_mb()) && options.bucket_cap_mb() > 0 &&
          options.bucket_cap_mb() <= DataParallelOptions::kMaxBucketCapMb,
      "lamp::distributed::DataParallel: DataParallelOptions::bucket_cap_mb "
      "must be a size in MiB in (0, ",
      DataParallelOptions::kMaxBucketCapMb, "], got ", options.bucket_cap_mb(),
      "; pass a positive finite size such as the default 25 (",
      DataParallelOptions::kMaxBucketCapMb,
      " MiB, 1 TiB, already puts all the parameters of a dtype in one "
      "bucket).");
  const auto comm = options.communication_dtype();
  TORCH_CHECK(
      !comm || *comm == torch::kHalf || *comm == torch::kBFloat16 ||
          *comm == torch::kFloat,
      "lamp::distributed::DataParallel: communication_dtype must be kHalf, kBFloat16 or kFloat.");
  TORCH_CHECK(
      options.zero_stage() >= 0 && options.zero_stage() <= 2,
      "lamp::distributed::DataParallel: zero_stage must be 0 (optimizer state on every rank), 1 (sharded) or 2 (sharded, gradients reduce-scattered), got ",
      options.zero_stage(), ".");
  TORCH_CHECK(
      options.zero_stage() != 2 || !comm,
      "lamp::distributed::DataParallel: communication_dtype applies to stages 0 and 1; stage 2 reduce-scatters each gradient in its parameter's dtype.");
  auto& impl = *impl_;
  impl.group = group_;
  impl.options = options;
  // A tied weight is one parameter: one hook, one slot in one bucket.
  for (auto& p : unique_parameters(*model)) {
    if (p.requires_grad()) {
      TORCH_CHECK(p.device() == group_->device(),
                  "lamp::distributed::DataParallel: a parameter is on ",
                  p.device(), " but the process group communicates on ",
                  group_->device(),
                  "; move the model to the group's device first.");
      impl.params.push_back(p);
    }
  }
  impl.buffers = model->buffers();

  // 1. Every rank has the same model, then starts from rank 0's weights
  // and buffers. (A model that differs would otherwise fail inside the
  // backend on mismatched sizes, or train on silently.)
  group_->check_same(
      "the model given to DataParallel", model_settings(*model, options),
      "Every rank must build the same model, in the same precision, with the same DataParallelOptions.");
  {
    // Frozen parameters too: one initialised from each rank's own seed
    // would otherwise differ for the whole run. A tied one goes once.
    std::vector<torch::Tensor> state = unique_parameters(*model);
    state.insert(state.end(), impl.buffers.begin(), impl.buffers.end());
    group_->broadcast_(state, 0, "the broadcast of rank 0's model");
  }
  {
    std::map<int, size_t> group_of_dtype;
    for (const auto& b : impl.buffers) {
      const int key = static_cast<int>(b.scalar_type());
      auto it = group_of_dtype.find(key);
      if (it == group_of_dtype.end()) {
        it = group_of_dtype.emplace(key, impl.buffer_groups.size()).first;
        impl.buffer_groups.emplace_back();
      }
      impl.buffer_groups[it->second].members.push_back(b);
    }
    for (auto& g : impl.buffer_groups) {
      int64_t numel = 0;
      for (const auto& b : g.members)
        numel += b.numel();
      g.flat = torch::empty({numel},
                            g.members[0].options().device(group_->device()));
    }
  }

  // Buckets: reverse registration order, one dtype each, up to the cap.
  const int64_t cap_bytes = bucket_cap_bytes(options);
  impl.bucket_of.resize(impl.params.size());
  impl.offset_of.resize(impl.params.size());
  impl.ready.assign(impl.params.size(), false);
  std::map<int, size_t> open_bucket; // param dtype -> bucket index
  std::vector<int64_t> bucket_numel;
  std::vector<torch::Dtype> bucket_dtype;
  for (size_t k = impl.params.size(); k-- > 0;) {
    const auto& p = impl.params[k];
    const auto dtype = p.scalar_type();
    const auto comm_dtype = (comm && dtype == torch::kFloat)
                                ? *comm
                                : static_cast<torch::Dtype>(dtype);
    const int64_t bytes =
        p.numel() * static_cast<int64_t>(torch::elementSize(comm_dtype));
    auto it = open_bucket.find(static_cast<int>(dtype));
    if (it == open_bucket.end() ||
        (bucket_numel[it->second] > 0 &&
         bucket_numel[it->second] * static_cast<int64_t>(torch::elementSize(
                                        bucket_dtype[it->second])) +
                 bytes >
             cap_bytes)) {
      impl.buckets.emplace_back();
      bucket_numel.push_back(0);
      bucket_dtype.push_back(comm_dtype);
      open_bucket[static_cast<int>(dtype)] = impl.buckets.size() - 1;
      it = open_bucket.find(static_cast<int>(dtype));
    }
    auto& bucket = impl.buckets[it->second];
    impl.bucket_of[k] = it->second;
    impl.offset_of[k] = bucket_numel[it->second];
    bucket.params.push_back(k);
    bucket.offsets.push_back(bucket_numel[it->second]);
    bucket_numel[it->second] += p.numel();
  }
  for (size_t b = 0; b < impl.buckets.size(); ++b) {
    impl.buckets[b].buffer = torch::zeros(
        {bucket_numel[b]},
        torch::TensorOptions().dtype(bucket_dtype[b]).device(group_->device()));
    impl.buckets[b].name = "the gradient all-reduce of bucket " +
                           std::to_string(b + 1) + " of " +
                           std::to_string(impl.buckets.size());
  }
  impl.reset();

  impl.accumulators.resize(impl.params.size());
  for (size_t k = 0; k < impl.params.size(); ++k) {
    hook(impl_, k);
  }
}

void DataParallel::hook(const std::shared_ptr<Impl>& impl, size_t k) {
  // After the parameter's gradient accumulation (DDP's place for it): the
  // .grad it reads is the complete one for this backward.
  std::weak_ptr<Impl> weak = impl;
  auto accumulator = torch::autograd::impl::grad_accumulator(impl->params[k]);
  accumulator->add_post_hook(
      std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, k](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list& /*inputs*/) {
            if (auto alive = weak.lock()) {
              alive->mark_ready(k);
            }
            return outputs;
          }));
  impl->accumulators[k] = std::move(accumulator);
}

DataParallel::~DataParallel() = default;

void DataParallel::before_forward() {
  // A parameter whose data was replaced (Module::load, which torch::load
  // and TrainStep::load call, sets it with Tensor::set_) accumulates its
  // gradient in a new autograd node: the hook on the old one would never
  // run again and the parameter would train on a zero gradient. Hooked
  // again here, before the forward that builds the graph.
  for (size_t k = 0; k < impl_->params.size(); ++k) {
    if (torch::autograd::impl::grad_accumulator(impl_->params[k]) !=
        impl_->accumulators[k]) {
      hook(impl_, k);
    }
  }
  if (!impl_->options.broadcast_buffers() || !group_->is_distributed()) {
    return;
  }
  torch::NoGradGuard no_grad;
  const bool root = group_->rank() == 0;
  for (auto& g : impl_->buffer_groups) {
    int64_t offset = 0;
    if (root) {
      for (const auto& b : g.members) {
        g.flat.narrow(0, offset, b.numel()).view_as(b).copy_(b);
        offset += b.numel();
      }
    }
    group_->broadcast_(g.flat, 0,
                       "the broadcast of rank 0's buffers before forward");
    if (!root) {
      for (auto& b : g.members) {
        b.copy_(g.flat.narrow(0, offset, b.numel()).view_as(b));
        offset += b.numel();
      }
    }
  }
}

void DataParallel::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sync = sync;
}

void DataParallel::finish_gradient_sync() {
  auto& impl = *impl_;
  std::lock_guard<std::mutex> lock(impl.mutex);
  if (!impl.sync) {
    return;
  }
  torch::NoGradGuard no_grad;
  // Parameters without a gradient in this backward: what they accumulated
  // in the micro-batches before it (set_sync(false); a branch the last one
  // did not take), as on one process, else zero.
  for (size_t b = impl.next_bucket; b < impl.buckets.size(); ++b) {
    auto& bucket = impl.buckets[b];
    if (impl.shard_buckets) {
      Impl::make_buffer(bucket, group_->device());
    }
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const size_t k = bucket.params[j];
      if (!impl.ready[k]) {
        auto slice =
            bucket.buffer.narrow(0, bucket.offsets[j], impl.params[k].numel());
        auto& grad = impl.params[k].mutable_grad();
        if (grad.defined()) {
          slice.copy_(grad.flatten());
          if (impl.shard_buckets) {
            grad.reset(); // as mark_ready(): the bucket has it
          }
        } else {
          slice.zero_();
        }
        impl.ready[k] = true;
      }
    }
    bucket.pending = 0;
  }
  impl.launch_ready_buckets();
  for (auto& bucket : impl.buckets) {
    bucket.work->wait();
    if (impl.shard_buckets) {
      if (!bucket.shard_out.is_same(bucket.shard_grad)) {
        bucket.shard_grad.copy_(bucket.shard_out);
      }
      bucket.buffer = torch::Tensor();
      continue;
    }
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      auto& p = impl.params[bucket.params[j]];
      auto averaged =
          bucket.buffer.narrow(0, bucket.offsets[j], p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else {
        p.mutable_grad() = averaged.to(p.scalar_type(), /*non_blocking=*/false,
                                       /*copy=*/true);
      }
    }
  }
  impl.reset();
}

int64_t DataParallel::bucket_count() const {
  return static_cast<int64_t>(impl_->buckets.size());
}

void DataParallel::reduce_found_inf(torch::Tensor& found_inf) {
  // Made once, at construction: no std::function per step.
  if (reduce_found_inf_) {
    reduce_found_inf_(found_inf);
  }
}

void DataParallel::reduce_max_(torch::Tensor& values) {
  if (group_->is_distributed()) {
    group_->all_reduce_(values, ReduceOp::kMax, "the FP8 amax all-reduce");
  }
}

std::unique_ptr<OptimizerSharding> DataParallel::optimizer_sharding() {
  if (impl_->options.zero_stage() == 0) {
    return nullptr;
  }
  if (impl_->options.zero_stage() == 2) {
    std::weak_ptr<Impl> weak = impl_;
    return detail::stage2_sharding(
        group_, bucket_cap_bytes(impl_->options),
        [weak](std::vector<detail::ShardBucket> buckets) {
          if (auto impl = weak.lock()) {
            impl->use_shard_buckets(std::move(buckets));
          }
        });
  }
  return distributed::optimizer_sharding(group_);
}

void DataParallel::check_same_settings(
    const std::string& what,
    const std::vector<std::pair<std::string, std::string>>& settings) {
  group_->check_same(what, settings);
}

GradientSyncFactory data_parallel(std::shared_ptr<ProcessGroup> group,
                                  DataParallelOptions options) {
  return [group = std::move(group),
          options](const std::shared_ptr<torch::nn::Module>& model)
             -> std::unique_ptr<GradientSync> {
    // One process has nothing to average, but a sharded step is the same
    // flat FP32 state as on N ranks (and resumes from or for them).
    if (!group || (!group->is_distributed() && options.zero_stage() == 0)) {
      return nullptr;
    }
    return std::make_unique<DataParallel>(model, group, options);
  };
}

} // namespace distributed
} // namespace lamp
