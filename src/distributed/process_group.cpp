#include "lamp/distributed/process_group.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "distributed/backend.h"
#include "distributed/collective_watch.h"
#include "distributed/rank_address.h"
#include "distributed/rendezvous.h"

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
  // Where the other ranks find this process alive (its address is in the
  // store): a rank killed outright is named by the others.
  lamp::detail::RankListener listener;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<lamp::detail::C10dBackend> backend;
  // Last: it goes first, with the works it holds.
  std::unique_ptr<lamp::detail::CollectiveWatch> watch;
};

namespace {

// Who failed, for the one message every failed collective gives.
struct CollectiveSite {
  int rank = 0;
  int world_size = 1;
  std::string backend;
  std::chrono::milliseconds timeout{0};
  // Where the reasons other ranks left for stopping are read (null: none).
  lamp::detail::CollectiveWatch* watch = nullptr;
};

[[noreturn]] void fail_collective_at(const CollectiveSite& site,
                                     const char* what,
                                     const std::exception& error) {
  // A rank that stopped on its own error left its reason (Trainer::fit,
  // ProcessGroup::leave_word): named here, on the rank the user reads.
  std::string words;
  if (site.watch != nullptr) {
    words = site.watch->words_of_failure(what);
  }
  // Of two ranks, the other is the one.
  const std::string other = site.world_size == 2
                                ? "Rank " + std::to_string(1 - site.rank)
                                : std::string("Another rank");
  TORCH_CHECK(false, "lamp::distributed: ", what, " failed on rank ", site.rank,
              " of ", site.world_size, " (", site.backend,
              "): ", lamp::detail::error_text(error),
              words.empty()
                  ? ". " + other + " has probably exited or stopped answering"
                  : "; " + words,
              " (the timeout is ", site.timeout.count() / 1000.0,
              " s, --dist-timeout / ProcessGroupOptions::timeout); see its "
              "output.");
}

class WorkHandle final : public ProcessGroup::Work {
 public:
  // `staged` (when defined) is what was communicated for `target`, in a
  // dtype the backend reduces; wait() copies it back. `watch` (with the
  // ticket `watched`) is told when the caller has waited.
  WorkHandle(c10::intrusive_ptr<c10d::Work> work, torch::Tensor staged,
             torch::Tensor target, CollectiveSite site,
             lamp::detail::CollectiveWatch* watch, int64_t watched)
      : work_(std::move(work)),
        staged_(std::move(staged)),
        target_(std::move(target)),
        site_(std::move(site)),
        watch_(watch),
        watched_(watched) {}
  ~WorkHandle() override {
    if (work_ && watch_) {
      watch_->end(watched_); // dropped unwaited (an error in between)
    }
  }
  void wait() override {
    if (work_) {
      auto work = std::move(work_);
      try {
        work->wait();
      } catch (const std::exception& e) {
        watch_->end(watched_);
        fail_collective_at(site_, "all_reduce_async_", e);
      }
      watch_->end(watched_);
      if (staged_.defined()) {
        target_.copy_(staged_);
      }
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  torch::Tensor staged_;
  torch::Tensor target_;
  CollectiveSite site_;
  lamp::detail::CollectiveWatch* watch_;
  int64_t watched_;
};

// "all_reduce_" for an unnamed all_reduce_().
std::string named(const std::string& purpose, const char* call) {
  return purpose.empty() ? call : purpose;
}

// Starts a collective (`start()` returns its work), waits for it under
// `watch`'s eye, and turns its failure into the message naming `group`'s
// rank, backend and timeout.
template <typename Start>
void wait_watched(const ProcessGroup& group,
                  lamp::detail::CollectiveWatch* watch, const char* call,
                  const std::string& purpose, Start start) {
  try {
    auto work = start();
    lamp::detail::CollectiveWatch::Scope watched(watch, named(purpose, call),
                                                 work);
    work->wait();
  } catch (const std::exception& e) {
    fail_collective_at(CollectiveSite{group.rank(), group.world_size(),
                                      group.backend(), group.timeout(), watch},
                       call, e);
  }
}

// Gloo has no BF16 reductions: they run in FP32 there (exact for the
// inputs; one rounding back to BF16 at the end, as NCCL's does).
bool needs_fp32_reduction(const std::string& backend, const torch::Tensor& t) {
  return backend == "gloo" && t.scalar_type() == torch::kBFloat16;
}

// The longest RankListener::address() ("[IPv6]:PORT" is at most 53
// bytes); one longer is not shared.
constexpr int64_t kAddressBytes = 64;

// Every other rank's RankListener::address(), as (rank, address), from one
// all-gather as the group starts ("" for this rank's: none listens).
std::vector<std::pair<int, std::string>> gather_addresses(
    ProcessGroup& group, const std::string& mine) {
  auto shard = torch::zeros({kAddressBytes}, torch::kUInt8);
  if (static_cast<int64_t>(mine.size()) < kAddressBytes) {
    std::copy(mine.begin(), mine.end(), shard.data_ptr<uint8_t>());
  }
  auto flat = torch::zeros({group.world_size() * kAddressBytes},
                           shard.options().device(group.device()));
  group.all_gather_(flat, shard.to(group.device()),
                    "the gather of the ranks' addresses");
  const auto all = flat.cpu();
  const auto* bytes = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  std::vector<std::pair<int, std::string>> addresses;
  for (int r = 0; r < group.world_size(); ++r) {
    const auto* address = bytes + r * kAddressBytes;
    std::string text(address, strnlen(address, kAddressBytes));
    if (r != group.rank() && !text.empty()) {
      addresses.emplace_back(r, std::move(text));
    }
  }
  return addresses;
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
    const int local_rank = env ? env->local_rank : 0;
    // c10::DeviceIndex is int8_t: a larger index would wrap (LOCAL_RANK=256
    // to cuda:0). Checked here rather than in from_env(), where a CPU job
    // may have more local ranks than a device index holds.
    TORCH_CHECK(
        local_rank <= std::numeric_limits<c10::DeviceIndex>::max(),
        "lamp::distributed::ProcessGroup::from_environment: LOCAL_RANK=",
        local_rank,
        " picks the CUDA device of that index, but a device "
        "index is at most ",
        static_cast<int>(std::numeric_limits<c10::DeviceIndex>::max()),
        "; check LOCAL_RANK (torchrun sets it below nproc_per_node, at most "
        "one process per GPU), or pass a device with its index.");
    // A device this process does not see fails at its first use with
    // CUDA's "invalid device ordinal", naming neither; the other ranks
    // would wait for it at the rendezvous.
    const int devices = static_cast<int>(torch::cuda::device_count());
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    TORCH_CHECK(
        local_rank < devices,
        "lamp::distributed::ProcessGroup::from_environment: LOCAL_RANK=",
        local_rank,
        std::getenv("LOCAL_RANK") == nullptr && env ? " (not set: RANK's value)"
                                                    : "",
        " picks cuda:", local_rank, ", but this process sees ", devices,
        " CUDA device", devices == 1 ? "" : "s", " (CUDA_VISIBLE_DEVICES ",
        visible != nullptr ? std::string("= '") + visible + "'"
                           : std::string("unset"),
        "); start at most ", devices,
        " processes a node (torchrun --nproc-per-node), give each process "
        "its LOCAL_RANK on its node (a launcher other than torchrun: from "
        "SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK), or pass a device with "
        "its index.");
    device =
        torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
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
  TORCH_CHECK(options.wait_report_interval().count() > 0,
              "lamp::distributed::ProcessGroup::create: "
              "wait_report_interval must be positive.");
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
              lamp::detail::kNoGlooMessage);

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
  group->address_ = env.master_addr + ":" + std::to_string(env.master_port);
  auto joined = lamp::detail::join_rendezvous(env, options, group->address_);
  auto& store = joined.store;
  try {
    if (backend == "gloo") {
      group->impl_->backend = lamp::detail::make_gloo_backend(
          store, env.rank, env.world_size, options.timeout());
    } else {
      group->impl_->backend = lamp::detail::make_nccl_backend(
          store, env.rank, env.world_size, options.timeout());
    }
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "lamp::distributed: rank ", env.rank, " of ",
                env.world_size, " could not start the ", backend,
                " backend at ", group->address_,
                " (every rank had arrived): ", lamp::detail::error_text(e));
  }
  // Where every rank listens, gathered once: a rank whose collective fails
  // or waits finds which have ended, rank 0 among them (whose store may
  // have gone with it).
  group->impl_->listener =
      lamp::detail::RankListener::open(env.master_addr, env.master_port);
  auto addresses = gather_addresses(*group, group->impl_->listener.address());
  const auto report = options.wait_report() ? options.wait_report()
                                            : [](const std::string& line) {
                                                std::cerr << line << std::endl;
                                              };
  group->impl_->watch = std::make_unique<lamp::detail::CollectiveWatch>(
      std::move(joined.connect_again),
      lamp::detail::CollectiveWatch::Settings{
          env.rank, env.world_size, options.timeout(),
          options.collective_wait_report().count() > 0
              ? options.collective_wait_report()
              : lamp::detail::CollectiveWatch::default_interval(
                    options.timeout()),
          report, std::move(joined.server_gone), std::move(addresses),
          /*serves_store=*/!env.agent_store && env.rank == 0});
  group->impl_->store = std::move(store);
  return group;
}

void ProcessGroup::all_reduce_(torch::Tensor& tensor, ReduceOp op,
                               const std::string& purpose) {
  if (!is_distributed()) {
    return;
  }
  TORCH_CHECK(tensor.device() == device_,
              "lamp::distributed::all_reduce_: the tensor is on ",
              tensor.device(), " but the group communicates on ", device_, ".");
  const bool staged = needs_fp32_reduction(backend_name_, tensor);
  std::vector<torch::Tensor> tensors{staged ? tensor.to(torch::kFloat)
                                            : tensor};
  wait_watched(*this, impl_->watch.get(), "all_reduce_", purpose, [&] {
    return impl_->backend->allreduce(tensors, reduce_options(op));
  });
  if (staged) {
    tensor.copy_(tensors[0]);
  }
}

std::unique_ptr<ProcessGroup::Work> ProcessGroup::all_reduce_async_(
    torch::Tensor& tensor, const std::string& purpose) {
  if (!is_distributed()) {
    return std::make_unique<DoneWork>();
  }
  const bool staged = needs_fp32_reduction(backend_name_, tensor);
  std::vector<torch::Tensor> tensors{staged ? tensor.to(torch::kFloat)
                                            : tensor};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = impl_->backend->allreduce(tensors, reduce_options(ReduceOp::kSum));
  } catch (const std::exception& e) {
    fail_collective("all_reduce_async_", e);
  }
  const int64_t watched =
      impl_->watch->begin(named(purpose, "all_reduce_async_"), work);
  return std::make_unique<WorkHandle>(
      std::move(work), staged ? tensors[0] : torch::Tensor(), tensor,
      CollectiveSite{rank_, world_size_, backend_name_, timeout_,
                     impl_->watch.get()},
      impl_->watch.get(), watched);
}

void ProcessGroup::broadcast_(torch::Tensor& tensor, int root,
                              const std::string& purpose) {
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
  wait_watched(*this, impl_->watch.get(), "broadcast_", purpose,
               [&] { return impl_->backend->broadcast(tensors, options); });
}

namespace {

// The checks both sharded collectives make: 1-D `flat` of world_size times
// `shard`'s elements, one dtype, the group's device.
void check_shard_shapes(const char* call, const torch::Tensor& flat,
                        const torch::Tensor& shard, int world_size,
                        const torch::Device& device) {
  TORCH_CHECK(flat.dim() == 1 && shard.dim() == 1, "lamp::distributed::", call,
              ": flat and shard must be 1-D, not of shapes ", flat.sizes(),
              " and ", shard.sizes(), ".");
  TORCH_CHECK(flat.numel() == shard.numel() * world_size,
              "lamp::distributed::", call, ": flat has ", flat.numel(),
              " elements but must have world_size (", world_size,
              ") times the shard's ", shard.numel(), ".");
  TORCH_CHECK(flat.scalar_type() == shard.scalar_type(),
              "lamp::distributed::", call, ": flat is ", flat.scalar_type(),
              " but the shard ", shard.scalar_type(), "; give both one dtype.");
  TORCH_CHECK(flat.device() == device && shard.device() == device,
              "lamp::distributed::", call, ": the tensors are on ",
              flat.device(), " and ", shard.device(),
              " but the group communicates on ", device, ".");
  TORCH_CHECK(flat.is_contiguous() && shard.is_contiguous(),
              "lamp::distributed::", call,
              ": flat and shard must be contiguous.");
}

} // namespace

void ProcessGroup::all_gather_(torch::Tensor& flat, const torch::Tensor& shard,
                               const std::string& purpose) {
  check_shard_shapes("all_gather_", flat, shard, world_size_, device_);
  torch::NoGradGuard no_grad;
  if (!is_distributed()) {
    flat.copy_(shard);
    return;
  }
  const int64_t n = shard.numel();
  // Bits: 16-bit types travel as Half (Gloo has no BF16).
  const auto bits = [](const torch::Tensor& t) {
    return t.element_size() == 2 ? t.view(torch::kHalf) : t;
  };
  std::vector<torch::Tensor> inputs{bits(shard)};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) {
    outputs[0].push_back(bits(flat.narrow(0, r * n, n)));
  }
  wait_watched(*this, impl_->watch.get(), "all_gather_", purpose,
               [&] { return impl_->backend->allgather(outputs, inputs); });
}

void ProcessGroup::reduce_scatter_(torch::Tensor& shard, torch::Tensor& flat,
                                   const std::string& purpose) {
  reduce_scatter_async_(shard, flat, named(purpose, "reduce_scatter_"))->wait();
}

std::unique_ptr<ProcessGroup::Work> ProcessGroup::reduce_scatter_async_(
    torch::Tensor& shard, torch::Tensor& flat, const std::string& purpose) {
  check_shard_shapes("reduce_scatter_async_", flat, shard, world_size_,
                     device_);
  torch::NoGradGuard no_grad;
  if (!is_distributed()) {
    shard.copy_(flat);
    return std::make_unique<DoneWork>();
  }
  const int64_t n = shard.numel();
  const bool staged = needs_fp32_reduction(backend_name_, flat);
  auto input = staged ? flat.to(torch::kFloat) : flat;
  const CollectiveSite site{rank_, world_size_, backend_name_, timeout_,
                            impl_->watch.get()};
  const auto name = named(purpose, "reduce_scatter_async_");
  c10::intrusive_ptr<c10d::Work> work;
  if (has_reduce_scatter_) {
    auto output = staged ? torch::empty({n}, input.options()) : shard;
    std::vector<torch::Tensor> outputs{output};
    std::vector<std::vector<torch::Tensor>> inputs(1);
    for (int r = 0; r < world_size_; ++r) {
      inputs[0].push_back(input.narrow(0, r * n, n));
    }
    try {
      work = impl_->backend->reduce_scatter(outputs, inputs);
    } catch (const std::exception& e) {
      // Refused at the call, before any communication, on every rank alike
      // (Gloo in LibTorch 1.13: "ProcessGroupGloo does not support
      // reduce_scatter"): the all-reduce below does it.
      if (lamp::detail::error_text(e).find("not support") ==
          std::string::npos) {
        fail_collective("reduce_scatter_async_", e);
      }
      has_reduce_scatter_ = false;
    }
    if (work) {
      const int64_t watched = impl_->watch->begin(name, work);
      return std::make_unique<WorkHandle>(
          std::move(work), staged ? output : torch::Tensor(), shard, site,
          impl_->watch.get(), watched);
    }
  }
  std::vector<torch::Tensor> tensors{input};
  try {
    work = impl_->backend->allreduce(tensors, reduce_options(ReduceOp::kSum));
  } catch (const std::exception& e) {
    fail_collective("reduce_scatter_async_", e);
  }
  const int64_t watched = impl_->watch->begin(name, work);
  // wait() copies this rank's slice of the sum into `shard`.
  return std::make_unique<WorkHandle>(std::move(work),
                                      input.narrow(0, rank_ * n, n), shard,
                                      site, impl_->watch.get(), watched);
}

void ProcessGroup::leave_word(const std::string& why) const {
  if (is_distributed() && impl_ && impl_->watch) {
    impl_->watch->leave_word(why);
  }
}

void ProcessGroup::fail_collective(const char* what,
                                   const std::exception& error) const {
  fail_collective_at(CollectiveSite{rank_, world_size_, backend_name_, timeout_,
                                    impl_ ? impl_->watch.get() : nullptr},
                     what, error);
}

void ProcessGroup::broadcast_(std::vector<torch::Tensor> tensors, int root,
                              const std::string& purpose) {
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
    broadcast_(flat, root, purpose);
    int64_t offset = 0;
    for (auto& t : item.second) {
      const int64_t n = t.numel();
      t.detach().copy_(flat.narrow(0, offset, n).view_as(t));
      offset += n;
    }
  }
}

void ProcessGroup::barrier(const std::string& purpose) {
  if (!is_distributed()) {
    return;
  }
  // An all-reduce rather than the backend's barrier: the same call on Gloo
  // and NCCL, and it honours the timeout on both.
  auto token = torch::zeros({1}, torch::TensorOptions().device(device_));
  all_reduce_(token, ReduceOp::kSum, named(purpose, "barrier"));
}

namespace {

// Settings as bytes: "<length>:<text>" for each name and value in turn.
std::vector<uint8_t> encode(const std::vector<RankSetting>& settings) {
  std::string text;
  for (const auto& s : settings) {
    for (const auto* part : {&s.first, &s.second}) {
      text += std::to_string(part->size()) + ":" + *part;
    }
  }
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::vector<RankSetting> decode(const std::vector<uint8_t>& bytes) {
  const std::string text(bytes.begin(), bytes.end());
  std::vector<std::string> parts;
  size_t at = 0;
  while (at < text.size()) {
    const size_t colon = text.find(':', at);
    TORCH_INTERNAL_ASSERT(colon != std::string::npos,
                          "lamp: malformed settings from another rank");
    const size_t n = std::stoul(text.substr(at, colon - at));
    parts.push_back(text.substr(colon + 1, n));
    at = colon + 1 + n;
  }
  TORCH_INTERNAL_ASSERT(parts.size() % 2 == 0,
                        "lamp: malformed settings from another rank");
  std::vector<RankSetting> settings;
  for (size_t i = 0; i < parts.size(); i += 2) {
    settings.emplace_back(parts[i], parts[i + 1]);
  }
  return settings;
}

// "0.1 on rank 0 and 0.2 on rank 1"; with more ranks, one entry per value
// ("0.1 on ranks 0, 2 and 0.2 on rank 1").
std::string values_by_rank(const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < values.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == values[r]; });
    if (it == groups.end()) {
      groups.push_back({values[r], {}});
      it = groups.end() - 1;
    }
    it->second.push_back(static_cast<int>(r));
  }
  std::string text;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) {
      text += i + 1 == groups.size() ? " and " : ", ";
    }
    text += groups[i].first + " on rank" +
            (groups[i].second.size() > 1 ? "s " : " ") +
            lamp::detail::rank_list(groups[i].second);
  }
  return text;
}

} // namespace

void ProcessGroup::check_same(const std::string& what,
                              const std::vector<RankSetting>& settings,
                              const std::string& advice) {
  if (!is_distributed()) {
    return;
  }
  const std::string prefix = "check/" + std::to_string(checks_++) + "/";
  std::vector<std::vector<RankSetting>> all(world_size_);
  try {
    lamp::detail::CollectiveWatch::Scope watched(
        impl_->watch.get(), "comparing " + what + " across ranks");
    impl_->store->set(prefix + std::to_string(rank_), encode(settings));
    for (int r = 0; r < world_size_; ++r) {
      all[r] = r == rank_
                   ? settings
                   : decode(impl_->store->get(prefix + std::to_string(r)));
    }
  } catch (const std::exception& e) {
    fail_collective(("comparing " + what + " across ranks").c_str(), e);
  }
  // Every name in rank 0's order, then those only other ranks have.
  std::vector<std::string> names;
  std::vector<std::map<std::string, std::string>> by_name(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    for (const auto& s : all[r]) {
      if (by_name[r].emplace(s.first, s.second).second &&
          std::find(names.begin(), names.end(), s.first) == names.end()) {
        names.push_back(s.first);
      }
    }
  }
  for (const auto& name : names) {
    std::vector<std::string> values;
    for (int r = 0; r < world_size_; ++r) {
      const auto it = by_name[r].find(name);
      values.push_back(it == by_name[r].end() ? "(absent)" : it->second);
    }
    if (std::adjacent_find(values.begin(), values.end(),
                           std::not_equal_to<>()) == values.end()) {
      continue;
    }
    TORCH_CHECK(
        false, "lamp::distributed: the ranks differ in ", what, ": ", name,
        " is ", values_by_rank(values), " (", world_size_, " ranks at ",
        address_, "). ",
        advice.empty() ? "Start every rank with the same settings." : advice);
  }
}

std::function<void(torch::Tensor&)> found_inf_reduction(
    std::shared_ptr<ProcessGroup> group) {
  if (!group || !group->is_distributed()) {
    return nullptr;
  }
  return [group](torch::Tensor& found_inf) {
    static const std::string kPurpose =
        "the overflow check's all-reduce (GradScaler's found_inf)";
    if (found_inf.device() == group->device()) {
      group->all_reduce_(found_inf, ReduceOp::kMax, kPurpose);
      return;
    }
    auto on_group = found_inf.to(group->device());
    group->all_reduce_(on_group, ReduceOp::kMax, kPurpose);
    found_inf.copy_(on_group);
  };
}

} // namespace distributed
} // namespace lamp
