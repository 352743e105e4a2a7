#include "lamp/distributed/process_group.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <map>
#include <mutex>
#include <utility>

#include "distributed/backend.h"

namespace lamp {
namespace distributed {
namespace {

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
  TORCH_CHECK(
      options.timeout().count() > 0,
      "lamp::distributed::ProcessGroup::create: the timeout must be positive.");
  std::string backend = options.backend();
  if (backend == "auto") {
    backend = device.is_cuda() ? "nccl" : "gloo";
  }
  TORCH_CHECK(backend == "gloo" || backend == "nccl",
              "lamp::distributed: unknown backend '", options.backend(),
              "'; use auto, gloo or nccl.");
  TORCH_CHECK(
      backend != "nccl" || device.is_cuda(),
      "lamp::distributed: the NCCL backend communicates CUDA tensors, but the device is ",
      device, ". Use backend gloo for the CPU.");
  TORCH_CHECK(
      backend != "gloo" || device.is_cpu(),
      "lamp::distributed: lamp's Gloo backend communicates CPU tensors, but the device is ",
      device, ". Use backend nccl (or auto) for CUDA.");
  // Before the rendezvous, so that no rank waits for one that cannot come.
  // Gloo asked for by name fails even for one process: the program would
  // fail as soon as it runs with more. "auto" needs Gloo only for more.
  TORCH_CHECK(backend != "gloo" || gloo_available() ||
                  (options.backend() == "auto" && env.world_size == 1),
              "lamp::distributed: cannot use Gloo for backend '",
              options.backend(), "' on ", device,
              " with WORLD_SIZE=", env.world_size, ": ",
              detail::kNoGlooMessage);

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
        ". Check that every rank was started (torchrun --nproc-per-node/--nnodes), that MASTER_ADDR:MASTER_PORT is reachable from this host, and that no other job uses the port.");
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
              "lamp::distributed::all_reduce_: the tensor is on ",
              tensor.device(), " but the group communicates on ", device_, ".");
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
              "lamp::distributed::broadcast_: root ", root,
              " is outside world size ", world_size_, ".");
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
  TORCH_CHECK(
      false, "lamp::distributed: ", what, " failed on rank ", rank_, " of ",
      world_size_, " (", backend_name_,
      "): ", c10_error ? c10_error->what_without_backtrace() : error.what(),
      ". Another rank has probably exited or stopped answering (the timeout is ",
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

std::function<void(torch::Tensor&)> found_inf_reduction(
    std::shared_ptr<ProcessGroup> group) {
  if (!group || !group->is_distributed()) {
    return nullptr;
  }
  return [group](torch::Tensor& found_inf) {
    if (found_inf.device() == group->device()) {
      group->all_reduce_(found_inf, ReduceOp::kMax);
      return;
    }
    auto on_group = found_inf.to(group->device());
    group->all_reduce_(on_group, ReduceOp::kMax);
    found_inf.copy_(on_group);
  };
}

} // namespace distributed
} // namespace lamp
