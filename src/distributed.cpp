#include "lamp/distributed.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "detail/distributed_backend.h"
#include "lamp/grad_scaler.h"

namespace lamp {

void GradScaler::set_process_group(
    std::shared_ptr<distributed::ProcessGroup> group) {
  if (!group || !group->is_distributed()) {
    set_found_inf_reduction(nullptr);
    return;
  }
  set_found_inf_reduction([group](torch::Tensor& found_inf) {
    if (found_inf.device() == group->device()) {
      group->all_reduce_(found_inf, distributed::ReduceOp::kMax);
      return;
    }
    auto on_group = found_inf.to(group->device());
    group->all_reduce_(on_group, distributed::ReduceOp::kMax);
    found_inf.copy_(on_group);
  });
}
namespace distributed {
namespace {

c10::optional<std::string> getenv_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return c10::nullopt;
  }
  return std::string(value);
}

int parse_int(const char* name, const std::string& text, int min_value) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  TORCH_CHECK(errno == 0 && end != text.c_str() && *end == '\0' &&
                  value >= min_value && value <= 1 << 30,
              "lamp::distributed: environment variable ", name, "='", text,
              "' is not an integer >= ", min_value,
              ". Start the program with torchrun, or set RANK, WORLD_SIZE, "
              "MASTER_ADDR and MASTER_PORT yourself.");
  return static_cast<int>(value);
}

int env_int(const char* name, int fallback, int min_value) {
  const auto text = getenv_string(name);
  return text ? parse_int(name, *text, min_value) : fallback;
}

c10d::AllreduceOptions reduce_options(ReduceOp op) {
  c10d::AllreduceOptions options;
  switch (op) {
    case ReduceOp::kSum:
      options.reduceOp = c10d::ReduceOp::SUM;
      break;
    case ReduceOp::kMax:
      options.reduceOp = c10d::ReduceOp::MAX;
      break;
    case ReduceOp::kMin:
      options.reduceOp = c10d::ReduceOp::MIN;
      break;
  }
  return options;
}

} // namespace

c10::optional<Environment> Environment::from_env() {
  const auto rank = getenv_string("RANK");
  const auto world = getenv_string("WORLD_SIZE");
  if (!rank && !world) {
    return c10::nullopt;
  }
  TORCH_CHECK(rank && world,
              "lamp::distributed: ", (rank ? "RANK" : "WORLD_SIZE"),
              " is set but ", (rank ? "WORLD_SIZE" : "RANK"),
              " is not. Start the program with torchrun, which sets both, or "
              "unset both for a single-process run.");
  Environment env;
  env.rank = parse_int("RANK", *rank, 0);
  env.world_size = parse_int("WORLD_SIZE", *world, 1);
  TORCH_CHECK(env.rank < env.world_size, "lamp::distributed: RANK=", env.rank,
              " must be smaller than WORLD_SIZE=", env.world_size, ".");
  env.local_rank = env_int("LOCAL_RANK", env.rank, 0);
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", env.world_size, 1);
  if (env.world_size > 1) {
    const auto addr = getenv_string("MASTER_ADDR");
    const auto port = getenv_string("MASTER_PORT");
    TORCH_CHECK(addr && port, "lamp::distributed: WORLD_SIZE=", env.world_size,
                " but MASTER_ADDR or MASTER_PORT is not set; the ranks meet "
                "at MASTER_ADDR:MASTER_PORT (torchrun sets both).");
    env.master_addr = *addr;
    env.master_port = parse_int("MASTER_PORT", *port, 1);
    TORCH_CHECK(env.master_port <= 65535,
                "lamp::distributed: MASTER_PORT=", env.master_port,
                " is not a TCP port (1-65535).");
  }
  env.agent_store =
      getenv_string("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  env.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0);
  return env;
}

// ---------------------------------------------------------------------------
// ProcessGroup

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<detail::C10dBackend> backend;
};

namespace {

class WorkHandle final : public ProcessGroup::Work {
 public:
  // `staged` (when defined) is what was communicated for `target`, in a
  // dtype the backend reduces; wait() copies it back.
  WorkHandle(c10::intrusive_ptr<c10d::Work> work, torch::Tensor staged,
             torch::Tensor target)
      : work_(std::move(work)),
        staged_(std::move(staged)),
        target_(std::move(target)) {}
  void wait() override {
    if (work_) {
      auto work = std::move(work_);
      work->wait();
      if (staged_.defined()) {
        target_.copy_(staged_);
      }
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  torch::Tensor staged_;
  torch::Tensor target_;
};

// Gloo has no BF16 reductions: they run in FP32 there (exact for the
// inputs; one rounding back to BF16 at the end, as NCCL's does).
bool needs_fp32_reduction(const std::string& backend, const torch::Tensor& t) {
  return backend == "gloo" && t.scalar_type() == torch::kBFloat16;
}

class DoneWork final : public ProcessGroup::Work {
 public:
  void wait() override {}
};

} // namespace

ProcessGroup::ProcessGroup(torch::Device device) : device_(device) {}

ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::from_environment(
    torch::Device device, ProcessGroupOptions options) {
  const auto env = Environment::from_env();
  if (device.is_cuda() && !device.has_index()) {
    device = torch::Device(torch::kCUDA, env ? env->local_rank : 0);
  }
  if (!env) {
    return std::make_shared<ProcessGroup>(device);
  }
  return create(*env, device, std::move(options));
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(
    const Environment& env, torch::Device device, ProcessGroupOptions options) {
  TORCH_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
              "lamp::distributed::ProcessGroup::create: rank ", env.rank,
              " is outside world size ", env.world_size, ".");
  TORCH_CHECK(options.timeout().count() > 0,
              "lamp::distributed::ProcessGroup::create: the timeout must be "
              "positive.");
  std::string backend = options.backend();
  if (backend == "auto") {
    backend = device.is_cuda() ? "nccl" : "gloo";
  }
  TORCH_CHECK(backend == "gloo" || backend == "nccl",
              "lamp::distributed: unknown backend '", options.backend(),
              "'; use auto, gloo or nccl.");
  TORCH_CHECK(backend != "nccl" || device.is_cuda(),
              "lamp::distributed: the NCCL backend communicates CUDA tensors, "
              "but the device is ",
              device, ". Use backend gloo for the CPU.");
  TORCH_CHECK(backend != "gloo" || device.is_cpu(),
              "lamp::distributed: lamp's Gloo backend communicates CPU "
              "tensors, but the device is ",
              device, ". Use backend nccl (or auto) for CUDA.");
  // Before the rendezvous, so that no rank waits for one that cannot come.
  // Gloo asked for by name fails even for one process: the program would
  // fail as soon as it runs with more. "auto" needs Gloo only for more.
  TORCH_CHECK(backend != "gloo" || gloo_available() ||
                  (options.backend() == "auto" && env.world_size == 1),
              "lamp::distributed: cannot use Gloo for backend '",
              options.backend(), "' on ", device, " with WORLD_SIZE=",
              env.world_size, ": ", detail::kNoGlooMessage);

  auto group = std::make_shared<ProcessGroup>(device);
  group->rank_ = env.rank;
  group->world_size_ = env.world_size;
  group->local_rank_ = env.local_rank;
  group->timeout_ = options.timeout();
  if (env.world_size == 1) {
    return group;
  }
  group->backend_name_ = backend;
  group->impl_ = std::make_unique<Impl>();
  const std::string where =
      env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(env.master_port);
    store_options.isServer = !env.agent_store && env.rank == 0;
    store_options.numWorkers = env.agent_store
                                   ? c10::nullopt
                                   : decltype(store_options.numWorkers)(
                                         static_cast<size_t>(env.world_size));
    store_options.waitWorkers = !env.agent_store;
    store_options.timeout = options.timeout();
    store_options.multiTenant = true;
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    if (env.agent_store) {
      // torchrun's agent serves the store; each restart has its own keys.
      store = c10::make_intrusive<c10d::PrefixStore>(
          "/worker/attempt_" + std::to_string(env.restart_count), store);
    }
    store = c10::make_intrusive<c10d::PrefixStore>("lamp/default_pg", store);
    store->setTimeout(options.timeout());
    group->impl_->store = store;
    if (backend == "gloo") {
      group->impl_->backend = detail::make_gloo_backend(
          store, env.rank, env.world_size, options.timeout());
    } else {
      group->impl_->backend = detail::make_nccl_backend(
          store, env.rank, env.world_size, options.timeout());
    }
  } catch (const c10::Error& e) {
    TORCH_CHECK(
        false, "lamp::distributed: rank ", env.rank, " of ", env.world_size,
        " could not join the process group at ", where, " (", backend,
        ", timeout ", options.timeout().count() / 1000.0,
        " s): ", e.what_without_backtrace(),
        ". Check that every rank was started (torchrun "
        "--nproc-per-node/--nnodes), that MASTER_ADDR:MASTER_PORT is "
        "reachable from this host, and that no other job uses the port.");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "lamp::distributed: rank ", env.rank, " of ",
                env.world_size, " could not join the process group at ", where,
                " (", backend, "): ", e.what());
  }
  return group;
}

void ProcessGroup::all_reduce_(torch::Tensor& tensor, ReduceOp op) {
  if (!is_distributed()) {
    return;
  }
  TORCH_CHECK(tensor.device() == device_,
              "lamp::distributed::all_reduce_: "
              "the tensor is on ",
              tensor.device(),
              " but the group "
              "communicates on ",
              device_, ".");
  const bool staged = needs_fp32_reduction(backend_name_, tensor);
  std::vector<torch::Tensor> tensors{staged ? tensor.to(torch::kFloat)
                                            : tensor};
  try {
    impl_->backend->allreduce(tensors, reduce_options(op))->wait();
  } catch (const std::exception& e) {
    fail_collective("all_reduce_", e);
  }
  if (staged) {
    tensor.copy_(tensors[0]);
  }
}

std::unique_ptr<ProcessGroup::Work> ProcessGroup::all_reduce_async_(
    torch::Tensor& tensor) {
  if (!is_distributed()) {
    return std::make_unique<DoneWork>();
  }
  const bool staged = needs_fp32_reduction(backend_name_, tensor);
  std::vector<torch::Tensor> tensors{staged ? tensor.to(torch::kFloat)
                                            : tensor};
  return std::make_unique<WorkHandle>(
      impl_->backend->allreduce(tensors, reduce_options(ReduceOp::kSum)),
      staged ? tensors[0] : torch::Tensor(), tensor);
}

void ProcessGroup::broadcast_(torch::Tensor& tensor, int root) {
  if (!is_distributed()) {
    return;
  }
  TORCH_CHECK(root >= 0 && root < world_size_,
              "lamp::distributed::broadcast_: "
              "root ",
              root, " is outside world size ", world_size_, ".");
  // A copy of bits: 16-bit types travel as Half (Gloo has no BF16/int16).
  std::vector<torch::Tensor> tensors{
      tensor.element_size() == 2 ? tensor.view(torch::kHalf) : tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  try {
    impl_->backend->broadcast(tensors, options)->wait();
  } catch (const std::exception& e) {
    fail_collective("broadcast_", e);
  }
}

void ProcessGroup::fail_collective(const char* what,
                                   const std::exception& error) const {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  TORCH_CHECK(false, "lamp::distributed: ", what, " failed on rank ", rank_,
              " of ", world_size_, " (", backend_name_, "): ",
              c10_error ? c10_error->what_without_backtrace() : error.what(),
              ". Another rank has probably exited or stopped answering (the "
              "timeout is ",
              timeout_.count() / 1000.0, " s); see its output.");
}

void ProcessGroup::broadcast_(std::vector<torch::Tensor> tensors, int root) {
  if (!is_distributed() || tensors.empty()) {
    return;
  }
  torch::NoGradGuard no_grad;
  // One message per dtype, in a fixed (dtype) order on every rank.
  std::map<int, std::vector<torch::Tensor>> by_dtype;
  for (auto& t : tensors) {
    by_dtype[static_cast<int>(t.scalar_type())].push_back(t);
  }
  for (auto& item : by_dtype) {
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : item.second) {
      flat_parts.push_back(t.detach().to(device_).reshape(-1));
    }
    auto flat = torch::cat(flat_parts);
    broadcast_(flat, root);
    int64_t offset = 0;
    for (auto& t : item.second) {
      const int64_t n = t.numel();
      t.detach().copy_(flat.narrow(0, offset, n).view_as(t));
      offset += n;
    }
  }
}

void ProcessGroup::barrier() {
  if (!is_distributed()) {
    return;
  }
  // An all-reduce rather than the backend's barrier: the same call on Gloo
  // and NCCL, and it honours the timeout on both.
  auto token = torch::zeros({1}, torch::TensorOptions().device(device_));
  all_reduce_(token);
}

// ---------------------------------------------------------------------------
// DataParallel

namespace {

struct Bucket {
  std::vector<size_t> params;   // indices into DataParallel::Impl::params
  std::vector<int64_t> offsets; // element offset of each in `buffer`
  torch::Tensor buffer;         // flat, in the communication dtype
  int64_t pending = 0;          // parameters not yet ready in this backward
  std::unique_ptr<ProcessGroup::Work> work;
};

} // namespace

struct DataParallel::Impl {
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
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  size_t next_bucket = 0;
  bool sync = true;
  std::mutex mutex;

  void launch(Bucket& bucket) {
    // Averaged before the sum (DDP and the compress hooks divide first).
    bucket.buffer.div_(group->world_size());
    bucket.work = group->all_reduce_async_(bucket.buffer);
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
    TORCH_CHECK(!bucket.work, "lamp::distributed::DataParallel: parameter ",
                index,
                " received a second gradient after its bucket's "
                "all-reduce had started. Call backward once per step (or "
                "set_sync(false) for all but the last of several).");
    const auto& grad = params[index].grad();
    auto slice =
        bucket.buffer.narrow(0, offset_of[index], params[index].numel());
    if (grad.defined()) {
      slice.copy_(grad.reshape(-1));
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
    : impl_(std::make_shared<Impl>()), group_(std::move(group)) {
  TORCH_CHECK(model != nullptr,
              "lamp::distributed::DataParallel: the model "
              "is null.");
  TORCH_CHECK(group_ != nullptr,
              "lamp::distributed::DataParallel: the "
              "process group is null.");
  TORCH_CHECK(options.bucket_cap_mb() > 0,
              "lamp::distributed::DataParallel: "
              "bucket_cap_mb must be positive, got ",
              options.bucket_cap_mb(), ".");
  const auto comm = options.communication_dtype();
  TORCH_CHECK(!comm || *comm == torch::kHalf || *comm == torch::kBFloat16 ||
                  *comm == torch::kFloat,
              "lamp::distributed::DataParallel: communication_dtype must be "
              "kHalf, kBFloat16 or kFloat.");
  auto& impl = *impl_;
  impl.group = group_;
  impl.options = options;
  for (auto& p : model->parameters()) {
    if (p.requires_grad()) {
      TORCH_CHECK(p.device() == group_->device(),
                  "lamp::distributed::"
                  "DataParallel: a parameter is on ",
                  p.device(),
                  " but the "
                  "process group communicates on ",
                  group_->device(),
                  "; move the model to the group's device first.");
      impl.params.push_back(p);
    }
  }
  impl.buffers = model->buffers();

  // 1. Every rank starts from rank 0's weights and buffers.
  {
    std::vector<torch::Tensor> state = impl.params;
    state.insert(state.end(), impl.buffers.begin(), impl.buffers.end());
    group_->broadcast_(state, 0);
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
  const int64_t cap_bytes =
      static_cast<int64_t>(options.bucket_cap_mb() * 1024.0 * 1024.0);
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
  }
  impl.reset();

  // Hooks after each parameter's gradient accumulation (DDP's place for
  // them): the .grad they read is the complete one for this backward.
  std::weak_ptr<Impl> weak = impl_;
  for (size_t k = 0; k < impl.params.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(impl.params[k]);
    accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [weak, k](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              if (auto alive = weak.lock()) {
                alive->mark_ready(k);
              }
              return outputs;
            }));
    impl.accumulators.push_back(std::move(accumulator));
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::before_forward() {
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
    group_->broadcast_(g.flat, 0);
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
  // Parameters without a gradient in this backward count as zero.
  for (size_t b = impl.next_bucket; b < impl.buckets.size(); ++b) {
    auto& bucket = impl.buckets[b];
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const size_t k = bucket.params[j];
      if (!impl.ready[k]) {
        bucket.buffer.narrow(0, bucket.offsets[j], impl.params[k].numel())
            .zero_();
        impl.ready[k] = true;
      }
    }
    bucket.pending = 0;
  }
  impl.launch_ready_buckets();
  for (auto& bucket : impl.buckets) {
    bucket.work->wait();
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

} // namespace distributed
} // namespace lamp
