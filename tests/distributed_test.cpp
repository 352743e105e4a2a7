#include <gtest/gtest.h>
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/collective_watch.h"
#include "distributed/rank_address.h"
#include "lamp/data/loader.h"
#include "lamp/distributed.h"
#include "test_util.h"

namespace {

using lamp::distributed::Environment;
using lamp::distributed::ProcessGroup;
using lamp_test::expect_error;

// Sets torchrun's variables for one test and restores them after.
struct ScopedEnv {
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT"}) {
      unsetenv(name);
    }
    for (const auto& v : vars)
      setenv(v.first.c_str(), v.second.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT"}) {
      unsetenv(name);
    }
  }
};

TEST(Environment, AbsentMeansSingleProcess) {
  ScopedEnv env({});
  EXPECT_FALSE(Environment::from_env().has_value());
  auto group = ProcessGroup::from_environment(torch::kCPU);
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_FALSE(group->is_distributed());
  EXPECT_TRUE(group->is_main());
  EXPECT_EQ(group->backend(), "none");
  auto t = torch::tensor({1.0f, 2.0f});
  group->all_reduce_(t); // one process: unchanged
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0f, 2.0f})));
  group->barrier();
}

TEST(Environment, ReadsTorchrunsVariables) {
  ScopedEnv env({{"RANK", "3"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29600"}});
  const auto e = Environment::from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29600);
}

TEST(Environment, RejectsPartialOrMalformedVariables) {
  {
    ScopedEnv env({{"RANK", "0"}, {"LOCAL_RANK", "0"}});
    expect_error([] { Environment::from_env(); }, "WORLD_SIZE is not");
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    expect_error([] { Environment::from_env(); },
                 "must be smaller than WORLD_SIZE");
  }
  {
    ScopedEnv env({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    expect_error([] { Environment::from_env(); }, "RANK='x'");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    expect_error([] { Environment::from_env(); }, "MASTER_ADDR or MASTER_PORT");
  }
  {
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "70000"}});
    expect_error([] { Environment::from_env(); }, "not a TCP port");
  }
  {
    // A mistyped WORLD_SIZE is refused at once, not gathered rank by rank.
    ScopedEnv env({{"RANK", "1"},
                   {"WORLD_SIZE", "1073741824"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}});
    expect_error([] { Environment::from_env(); },
                 "WORLD_SIZE=1073741824 is more ranks than one rendezvous "
                 "can gather (at most 1048576)");
  }
  {
    // A LOCAL_RANK outside this machine's processes would pick another
    // rank's GPU.
    ScopedEnv env({{"RANK", "1"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "2"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}});
    expect_error([] { Environment::from_env(); },
                 "LOCAL_RANK=2 must be smaller than LOCAL_WORLD_SIZE=2; "
                 "check the variables");
  }
  {
    // Without LOCAL_WORLD_SIZE, the bound is the job's size.
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "5"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}});
    expect_error([] { Environment::from_env(); },
                 "LOCAL_RANK=5 must be smaller than WORLD_SIZE=2 "
                 "(LOCAL_WORLD_SIZE is not set)");
  }
}

TEST(Environment, ALocalRankBeyondACudaDeviceIndexIsRefusedForCuda) {
  // c10::DeviceIndex is int8_t: LOCAL_RANK=256 would become cuda:0 (and
  // 200 a negative index). A CPU job may have that many local ranks.
  ScopedEnv env({{"RANK", "0"},
                 {"WORLD_SIZE", "1"},
                 {"LOCAL_RANK", "256"},
                 {"LOCAL_WORLD_SIZE", "512"}});
  EXPECT_EQ(Environment::from_env()->local_rank, 256);
  EXPECT_EQ(ProcessGroup::from_environment(torch::kCPU)->local_rank(), 256);
  expect_error([] { ProcessGroup::from_environment(torch::kCUDA); },
               "LOCAL_RANK=256 picks the CUDA device of that index, but a "
               "device index is at most 127; check LOCAL_RANK");
}

TEST(Environment, ALocalRankBeyondTheVisibleDevicesIsRefusedForCuda) {
  // cuda:100 on a machine of fewer GPUs (this one's CPU sees none): named
  // now, with the variables to check, not CUDA's "invalid device ordinal"
  // at the first use. Unset, LOCAL_RANK is RANK's: said so.
  ScopedEnv env({{"RANK", "100"},
                 {"WORLD_SIZE", "101"},
                 {"LOCAL_RANK", "100"},
                 {"LOCAL_WORLD_SIZE", "101"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", "29500"}});
  const auto devices = torch::cuda::device_count();
  ASSERT_LT(devices, 101) << "a machine of 101 GPUs";
  expect_error([] { ProcessGroup::from_environment(torch::kCUDA); },
               "LOCAL_RANK=100 picks cuda:100, but this process sees " +
                   std::to_string(devices) + " CUDA device");
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("LOCAL_WORLD_SIZE");
  expect_error([] { ProcessGroup::from_environment(torch::kCUDA); },
               "LOCAL_RANK=100 (not set: RANK's value) picks cuda:100");
}

// The CPU rendezvous needs Gloo: without it, create() refuses before any
// wait (Gloo.AutoOnTheCpuWithTwoRanksFailsAtOnceWithoutIt).
#define LAMP_SKIP_WITHOUT_GLOO()                                             \
  if (!lamp::distributed::gloo_available()) {                                \
    GTEST_SKIP() << "the CPU rendezvous needs Gloo, which this build lacks"; \
  }

// A socket listening on a port the system chose (so that tests running at
// the same time never share one), and the port.
struct ListeningSocket {
  int fd = -1;
  int port = 0;
  ListeningSocket() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = 0;
    socklen_t size = sizeof address;
    if (fd < 0 ||
        bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        listen(fd, 1) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      ADD_FAILURE() << "cannot listen on a free port";
      return;
    }
    port = ntohs(address.sin_port);
  }
  ~ListeningSocket() { close(fd); }
};

// A port that was free a moment ago.
int free_port() {
  return ListeningSocket().port;
}

// Rank `rank` of two meeting at a port nobody uses, with a short timeout
// and the waiting lines collected in `lines`.
struct LonelyRank {
  Environment env;
  lamp::distributed::ProcessGroupOptions options;
  std::vector<std::string> lines;

  explicit LonelyRank(int rank, int world_size = 2) {
    env.rank = rank;
    env.world_size = world_size;
    env.master_port = free_port();
    options.timeout(std::chrono::seconds(2))
        .wait_report_interval(std::chrono::milliseconds(400))
        .wait_report(
            [this](const std::string& line) { lines.push_back(line); });
  }
  std::string address() const {
    return "127.0.0.1:" + std::to_string(env.master_port);
  }
  double seconds_to_fail(const std::string& part) {
    const auto start = std::chrono::steady_clock::now();
    expect_error([&] { ProcessGroup::create(env, torch::kCPU, options); },
                 part);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  }
};

TEST(ProcessGroup, AMissingRankFailsWithinTheTimeoutNamingIt) {
  // Rank 0 of 3 alone: it says whom it waits for while it waits, and gives
  // up after the timeout naming the ranks that never came.
  LAMP_SKIP_WITHOUT_GLOO();
  LonelyRank rank0(0, 3);
  const double seconds =
      rank0.seconds_to_fail("waited 2 s at " + rank0.address() +
                            " but ranks 1, 2 never came (1 of 3 arrived)");
  EXPECT_GE(seconds, 1.9);
  EXPECT_LT(seconds, 30.0);
  ASSERT_GE(rank0.lines.size(), 2u);
  EXPECT_NE(rank0.lines[0].find("rank 0 of 3 waiting for 2 of 3 ranks at " +
                                rank0.address() + " (ranks 1, 2;"),
            std::string::npos)
      << rank0.lines[0];
}

TEST(ProcessGroup, AnUnreachableRendezvousSaysSoWhileWaiting) {
  // Rank 1 with no rank 0 serving: it says that it is trying to reach it.
  LAMP_SKIP_WITHOUT_GLOO();
  LonelyRank rank1(1);
  const double seconds = rank1.seconds_to_fail(
      "rank 1 of 2 could not reach the rendezvous at " + rank1.address());
  EXPECT_LT(seconds, 30.0);
  ASSERT_GE(rank1.lines.size(), 1u);
  EXPECT_NE(rank1.lines[0].find("rank 1 of 2 waiting to reach rank 0's "
                                "rendezvous at " +
                                rank1.address()),
            std::string::npos)
      << rank1.lines[0];
  // What it finds there: nobody, and what that means.
  EXPECT_NE(rank1.lines[0].find(": nothing listens there (connection "
                                "refused); rank 0 serves the store once it "
                                "starts: start it, or check MASTER_ADDR and "
                                "MASTER_PORT"),
            std::string::npos)
      << rank1.lines[0];
}

TEST(ProcessGroup, AnAgentStoreThatIsNotThereIsNamed) {
  // TORCHELASTIC_USE_AGENT_STORE=True outside torchrun: every rank,
  // rank 0 too, waits for an agent's store that nobody serves, and says so.
  LAMP_SKIP_WITHOUT_GLOO();
  LonelyRank rank0(0);
  rank0.env.agent_store = true;
  rank0.seconds_to_fail("could not reach the rendezvous at " + rank0.address());
  ASSERT_GE(rank0.lines.size(), 1u);
  EXPECT_NE(rank0.lines[0].find("rank 0 of 2 waiting to reach torchrun's "
                                "agent store at " +
                                rank0.address()),
            std::string::npos)
      << rank0.lines[0];
  EXPECT_NE(rank0.lines[0].find("nothing listens there (connection refused); "
                                "TORCHELASTIC_USE_AGENT_STORE=True says that "
                                "torchrun's agent serves the store, but none "
                                "is there"),
            std::string::npos)
      << rank0.lines[0];
}

TEST(ProcessGroup, AStopRequestEndsTheWaitAtOnce) {
  // A rank waiting for the others (rank 0 serving, rank 1 never coming) and
  // one waiting to reach the store (rank 1, no rank 0): a stop asked for
  // ends either wait within the poll, long before the timeout.
  LAMP_SKIP_WITHOUT_GLOO();
  for (const int rank : {0, 1}) {
    LonelyRank lonely(rank);
    lonely.options.timeout(std::chrono::seconds(30));
    const auto asked =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    lonely.options.stop_requested(
        [asked] { return std::chrono::steady_clock::now() >= asked; });
    const double seconds = lonely.seconds_to_fail(
        rank == 0 ? "stopped while waiting to meet the other ranks at " +
                        lonely.address()
                  : "stopped while waiting to reach the rendezvous at " +
                        lonely.address());
    EXPECT_LT(seconds, 3.0) << "rank " << rank;
  }
}

TEST(ProcessGroup, APortHeldByAnotherProgramIsNamed) {
  LAMP_SKIP_WITHOUT_GLOO();
  LonelyRank rank0(0);
  const int held = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(rank0.env.master_port));
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address),
            0)
      << "port " << rank0.env.master_port << " is in use; run again";
  ASSERT_EQ(listen(held, 1), 0);
  const double seconds = rank0.seconds_to_fail(
      "Another program holds port " + std::to_string(rank0.env.master_port));
  close(held);
  EXPECT_LT(seconds, 1.5); // at once, not after the timeout
}

TEST(ProcessGroup, AProgramThatAcceptsButNeverAnswersIsNamed) {
  // Rank 1 reaching a port where a program other than a rendezvous store
  // listens: the connection is accepted and nothing answers. The rank says
  // so when its first call goes unanswered, not silently at the end.
  LAMP_SKIP_WITHOUT_GLOO();
  // Open until the process has ended: the store's connection to it stays
  // behind with the unanswered call (the process is meant to end on this
  // error), and LibTorch 1.13's client aborts if the peer resets it.
  static const auto* other = new ListeningSocket(); // never closed
  LonelyRank rank1(1);
  rank1.env.master_port = other->port;
  // Said by the check of the first answer, not by a later store error.
  const double seconds = rank1.seconds_to_fail(
      "it is not a rendezvous store. Another program "
      "holds MASTER_PORT " +
      std::to_string(other->port));
  EXPECT_LT(seconds, 30.0);
}

TEST(ProcessGroup, CheckSameIsFreeForOneProcess) {
  ProcessGroup single;
  single.check_same("anything", {{"a", "1"}});
  EXPECT_FALSE(single.is_distributed());
}

TEST(ProcessGroup, RejectsABackendThatDoesNotFitTheDevice) {
  Environment env;
  expect_error(
      [&] {
        ProcessGroup::create(
            env, torch::kCPU,
            lamp::distributed::ProcessGroupOptions().backend("mpi"));
      },
      "unknown backend 'mpi'");
  expect_error(
      [&] {
        ProcessGroup::create(
            env, torch::kCPU,
            lamp::distributed::ProcessGroupOptions().backend("nccl"));
      },
      "NCCL backend communicates CUDA tensors");
}

TEST(DataParallel, RefusesABucketCapThatIsNotAFiniteSize) {
  // inf and 1e13 MiB overflow the cap in bytes (an int64_t); NaN, 0 and
  // negative sizes mean nothing.
  torch::nn::Linear model(2, 2);
  auto group = std::make_shared<ProcessGroup>(torch::kCPU);
  const auto with_cap = [&](double cap) {
    lamp::distributed::DataParallel dp(
        model.ptr(), group,
        lamp::distributed::DataParallelOptions().bucket_cap_mb(cap));
    return dp.bucket_count();
  };
  const std::vector<std::pair<double, std::string>> refused = {
      {std::numeric_limits<double>::infinity(), "inf"},
      {std::numeric_limits<double>::quiet_NaN(), "nan"},
      {1e13, "1e+13"},
      {0.0, "0"},
      {-1.0, "-1"}};
  for (const auto& cap : refused) {
    expect_error([&] { with_cap(cap.first); },
                 "DataParallelOptions::bucket_cap_mb must be a size in MiB in "
                 "(0, 1048576], got " +
                     cap.second + "; pass a positive finite size");
  }
  expect_error([&] { with_cap(1048576.5); }, "got 1.04858e+06;");
  // The largest accepted cap holds both parameters in one bucket.
  EXPECT_EQ(with_cap(1048576.0), 1);
}

// Every store entry seems present to a check and is gone by the read that
// follows: the rank deleted it in between.
struct EntriesDeletedAfterTheCheck : c10d::HashStore {
  bool check(const std::vector<std::string>& /*keys*/) override { return true; }
};

// The first report of a collective that rank 0 of 2 waits in, with the
// watch's store `store` and Settings::store_gone `store_gone`.
std::string first_wait_report(
    c10::intrusive_ptr<c10d::Store> store,
    std::function<std::string()> store_gone,
    std::vector<std::pair<int, std::string>> addresses = {}) {
  struct Lines {
    std::mutex mutex;
    std::condition_variable added;
    std::vector<std::string> lines;
  };
  auto seen = std::make_shared<Lines>();
  lamp::detail::CollectiveWatch::Settings settings;
  settings.rank = 0;
  settings.world_size = 2;
  settings.timeout = std::chrono::seconds(60);
  settings.interval = std::chrono::milliseconds(200);
  settings.report = [seen](const std::string& line) {
    std::lock_guard<std::mutex> lock(seen->mutex);
    seen->lines.push_back(line);
    seen->added.notify_all();
  };
  settings.store_gone = std::move(store_gone);
  settings.addresses = std::move(addresses);
  {
    lamp::detail::CollectiveWatch watch([store] { return store; }, settings);
    const auto id = watch.begin("the test's all-reduce", {});
    {
      std::unique_lock<std::mutex> lock(seen->mutex);
      seen->added.wait_for(lock, std::chrono::seconds(10),
                           [&] { return !seen->lines.empty(); });
    }
    watch.end(id);
  }
  std::lock_guard<std::mutex> lock(seen->mutex);
  return seen->lines.empty() ? std::string() : seen->lines[0];
}

TEST(CollectiveWatch, AnEntryDeletedWhileItIsReadCountsAsAbsent) {
  // Rank 0 of 2 waits; rank 1's entry disappears while the report reads it.
  // The report names rank 1 at once, rather than waiting in a read for the
  // store's timeout and saying that rank 0's store gave no answer.
  auto store = c10::make_intrusive<EntriesDeletedAfterTheCheck>();
  store->setTimeout(std::chrono::seconds(6));
  const auto line = first_wait_report(store, nullptr);
  EXPECT_NE(line.find("in the test's all-reduce (collective 0) for "
                      "rank 1, which has not reached it; giving up"),
            std::string::npos)
      << line;
}

// A store whose connection is closed: every call fails.
struct ClosedStore : c10d::HashStore {
  using c10d::HashStore::set;
  [[noreturn]] static void fail() {
    throw std::runtime_error("Connection reset by peer");
  }
  void set(const std::string& /*key*/,
           const std::vector<uint8_t>& /*value*/) override {
    fail();
  }
  std::vector<uint8_t> compareSet(
      const std::string& /*key*/, const std::vector<uint8_t>& /*expected*/,
      const std::vector<uint8_t>& /*desired*/) override {
    fail();
  }
};

TEST(CollectiveWatch, AStoreThatFailsIsExplainedByTheServerGone) {
  // The store's server (rank 0) gone: the report says what store_gone()
  // found, not the connection's error alone; while the server is there,
  // the store's error.
  const auto gone = first_wait_report(c10::make_intrusive<ClosedStore>(), [] {
    return std::string("rank 0 has gone without a word (test)");
  });
  EXPECT_NE(gone.find("(collective 0) for the other ranks; rank 0 has gone "
                      "without a word (test); giving up after 60 s"),
            std::string::npos)
      << gone;
  const auto there = first_wait_report(c10::make_intrusive<ClosedStore>(),
                                       [] { return std::string(); });
  EXPECT_NE(there.find("for the other ranks; rank 0's store: Connection reset "
                       "by peer; giving up"),
            std::string::npos)
      << there;
}

// A rank's listener accepts connections while it is open and refuses them
// once closed (its process ended): ranks_gone() says nothing of the first
// and names the second, with its address and what that means.
TEST(RankListener, ARankWhoseListenerClosedIsNamedAsGone) {
  auto listener = lamp::detail::RankListener::open("127.0.0.1", 29500);
  const auto address = listener.address();
  ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  auto other = lamp::detail::RankListener::open("127.0.0.1", 29500);
  ASSERT_FALSE(other.address().empty());
  EXPECT_NE(other.address(), address);
  EXPECT_EQ(lamp::detail::ranks_gone({{3, address}, {4, other.address()}}), "");
  listener = lamp::detail::RankListener(); // closed, as its process ends
  const auto gone =
      lamp::detail::ranks_gone({{3, address}, {4, other.address()}});
  EXPECT_EQ(gone, "rank 3 has gone without a word (its address " + address +
                      ": nothing listens there (connection refused)): its "
                      "process has ended, killed (by a signal, or by the "
                      "out-of-memory killer: see the system log, dmesg), "
                      "crashed, or done with fewer collectives than this "
                      "rank");
  // Two gone: both named.
  other = lamp::detail::RankListener();
  const auto both = lamp::detail::ranks_gone({{3, address}, {4, address}});
  EXPECT_NE(both.find("rank 3 has gone without a word"), std::string::npos);
  EXPECT_NE(both.find("than this rank; so has rank 4 (its address " + address +
                      ": nothing listens there (connection refused))"),
            std::string::npos)
      << both;
  // After rank 0's words: each one with its address only.
  EXPECT_EQ(lamp::detail::ranks_gone({{3, address}}, true),
            "so has rank 3 (its address " + address +
                ": nothing listens there (connection refused))");
  EXPECT_EQ(lamp::detail::ranks_gone({}), "");
  // Where the rendezvous is reached over IPv6 (where this machine has
  // its loopback), the address is written in brackets and read back.
  auto six = lamp::detail::RankListener::open("::1", 29500);
  if (!six.address().empty()) {
    EXPECT_EQ(six.address().rfind("[::1]:", 0), 0u) << six.address();
    EXPECT_EQ(lamp::detail::ranks_gone({{1, six.address()}}), "");
  }
}

// A collective that waits for a rank that has not come, and whose listener
// refuses: the report names it as gone.
TEST(CollectiveWatch, AWaitReportNamesAnAbsentRankThatHasGone) {
  std::string address;
  {
    auto listener = lamp::detail::RankListener::open("127.0.0.1", 29500);
    address = listener.address();
  }
  ASSERT_FALSE(address.empty());
  const auto line = first_wait_report(c10::make_intrusive<c10d::HashStore>(),
                                      nullptr, {{1, address}});
  EXPECT_NE(line.find("(collective 0) for rank 1, which has not reached it; "
                      "rank 1 has gone without a word (its address " +
                      address +
                      ": nothing listens there (connection refused)): its "
                      "process has ended, killed"),
            std::string::npos)
      << line;
}

// A failed collective of rank 1 of 3 whose rank 0 has gone, the store with
// it, and rank 2 too: both named, what that means said once; rank 0's
// listener is not asked (its store was).
TEST(CollectiveWatch, RankZeroGoneAndAnotherRankAreNamedTogether) {
  std::string zero, two;
  {
    auto a = lamp::detail::RankListener::open("127.0.0.1", 29500);
    auto b = lamp::detail::RankListener::open("127.0.0.1", 29500);
    zero = a.address();
    two = b.address();
  }
  ASSERT_FALSE(zero.empty());
  ASSERT_FALSE(two.empty());
  lamp::detail::CollectiveWatch::Settings settings;
  settings.rank = 1;
  settings.world_size = 3;
  settings.timeout = std::chrono::seconds(60);
  settings.interval = std::chrono::seconds(30);
  settings.report = [](const std::string& /*line*/) {};
  const std::string rank_zero =
      "rank 0 has gone without a word (its rendezvous store at 127.0.0.1:1: "
      "nothing listens there (connection refused)): " +
      lamp::detail::ended_process_words();
  settings.store_gone = [&] { return rank_zero; };
  settings.addresses = {{0, zero}, {2, two}};
  const auto store = c10::make_intrusive<c10d::HashStore>();
  lamp::detail::CollectiveWatch watch([store] { return store; }, settings);
  EXPECT_EQ(watch.words_of_stopped_ranks(),
            rank_zero + "; so has rank 2 (its address " + two +
                ": nothing listens there (connection refused))");
}

// The settings of a watch of rank `rank` of 3, its store found there.
lamp::detail::CollectiveWatch::Settings three_ranks_watch(
    int rank, std::vector<std::pair<int, std::string>> addresses) {
  lamp::detail::CollectiveWatch::Settings settings;
  settings.rank = rank;
  settings.world_size = 3;
  settings.timeout = std::chrono::seconds(60);
  settings.interval = std::chrono::seconds(30);
  settings.report = [](const std::string& /*line*/) {};
  settings.store_gone = [] { return std::string(); };
  settings.addresses = std::move(addresses);
  return settings;
}

// Rank 2 killed outright: rank 1's collective fails first, and what its
// listeners found is left in the store, so that rank 0, failing after rank
// 1 has ended too, names rank 2 through rank 1's words instead of both as
// gone. Taken back by the next fit() (leave_word("")), it is not read.
TEST(CollectiveWatch, AFailedCollectiveLeavesTheRankItFoundGone) {
  std::string two;
  {
    auto listener = lamp::detail::RankListener::open("127.0.0.1", 29500);
    two = listener.address();
  }
  auto zero = lamp::detail::RankListener::open("127.0.0.1", 29500);
  auto one = lamp::detail::RankListener::open("127.0.0.1", 29500);
  ASSERT_FALSE(two.empty());
  const auto store = c10::make_intrusive<c10d::HashStore>();
  lamp::detail::CollectiveWatch watch_one(
      [store] { return store; },
      three_ranks_watch(1, {{0, zero.address()}, {2, two}}));
  lamp::detail::CollectiveWatch watch_zero(
      [store] { return store; },
      three_ranks_watch(0, {{1, one.address()}, {2, two}}));
  const std::string gone = "rank 2 has gone without a word (its address " +
                           two +
                           ": nothing listens there (connection refused)): ";
  EXPECT_EQ(watch_one.words_of_failure("all_reduce_"),
            gone + lamp::detail::ended_process_words());
  EXPECT_EQ(watch_zero.words_of_stopped_ranks(),
            "rank 1 stopped: its collective (all_reduce_) failed: " + gone +
                lamp::detail::ended_process_words("rank 1"));
  watch_one.leave_word("");
  EXPECT_EQ(watch_zero.words_of_stopped_ranks(),
            gone + lamp::detail::ended_process_words());
}

// A failed collective whose words are another rank's reason leaves nothing
// of its own: the reason is in the store already.
TEST(CollectiveWatch, AFailedCollectiveLeavesNoWordWhereAReasonWasLeft) {
  auto zero = lamp::detail::RankListener::open("127.0.0.1", 29500);
  auto one = lamp::detail::RankListener::open("127.0.0.1", 29500);
  auto two = lamp::detail::RankListener::open("127.0.0.1", 29500);
  const auto store = c10::make_intrusive<c10d::HashStore>();
  lamp::detail::CollectiveWatch watch_two(
      [store] { return store; },
      three_ranks_watch(2, {{0, zero.address()}, {1, one.address()}}));
  lamp::detail::CollectiveWatch watch_one(
      [store] { return store; },
      three_ranks_watch(1, {{0, zero.address()}, {2, two.address()}}));
  lamp::detail::CollectiveWatch watch_zero(
      [store] { return store; },
      three_ranks_watch(0, {{1, one.address()}, {2, two.address()}}));
  watch_two.leave_word("out of memory");
  EXPECT_EQ(watch_one.words_of_failure("all_reduce_"),
            "rank 2 stopped: out of memory");
  EXPECT_EQ(watch_zero.words_of_stopped_ranks(),
            "rank 2 stopped: out of memory");
}

lamp::data::Dataset numbered(int64_t n) {
  lamp::data::Dataset d;
  d.inputs = torch::zeros({n, 1, 2, 2}, torch::kUInt8);
  d.targets = torch::arange(n, torch::kLong); // the label is the sample id
  return d;
}

std::vector<int64_t> epoch_ids(lamp::data::DeviceLoader& loader,
                               int64_t epoch) {
  loader.set_epoch(epoch);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const auto labels = loader.batch(i).targets;
    for (int64_t k = 0; k < labels.size(0); ++k)
      ids.push_back(labels[k].item<int64_t>());
  }
  return ids;
}

TEST(DeviceLoaderShards, DisjointCoveringEqualSizedAndReshuffledPerEpoch) {
  const int64_t n = 103, shards = 4; // 103 = 4 * 26 - 1: one padded sample
  const auto data = numbered(n);
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int64_t s = 0; s < shards; ++s) {
    lamp::data::DeviceLoader loader(
        data, torch::kCPU,
        lamp::data::LoaderOptions(8).seed(5).num_shards(shards).shard(s));
    EXPECT_EQ(loader.samples_per_epoch(), 26);
    epoch0.push_back(epoch_ids(loader, 0));
    epoch1.push_back(epoch_ids(loader, 1));
    EXPECT_EQ(epoch0.back().size(), 26u);
    EXPECT_NE(epoch0.back(), epoch1.back())
        << "shard " << s << " not reshuffled";
  }
  for (const auto* epoch : {&epoch0, &epoch1}) {
    std::multiset<int64_t> all;
    for (const auto& shard : *epoch)
      all.insert(shard.begin(), shard.end());
    std::set<int64_t> distinct(all.begin(), all.end());
    EXPECT_EQ(distinct.size(), static_cast<size_t>(n)); // covers the dataset
    EXPECT_EQ(all.size(), static_cast<size_t>(n + 1));  // one padded repeat
  }
  // The shards of one epoch are disjoint but for that repeat.
  std::multiset<int64_t> a(epoch0[0].begin(), epoch0[0].end());
  for (int64_t s = 1; s < shards; ++s) {
    for (auto id : epoch0[s])
      a.insert(id);
  }
  int64_t repeated = 0;
  for (int64_t id = 0; id < n; ++id)
    repeated += a.count(id) > 1;
  EXPECT_EQ(repeated, 1);
}

TEST(DeviceLoaderShards, RejectsBadShards) {
  const auto data = numbered(10);
  expect_error(
      [&] {
        lamp::data::DeviceLoader(
            data, torch::kCPU,
            lamp::data::LoaderOptions(4).num_shards(2).shard(2));
      },
      "must be in [0, num_shards = 2)");
  expect_error(
      [&] {
        lamp::data::DeviceLoader(data, torch::kCPU,
                                 lamp::data::LoaderOptions(4).num_shards(11));
      },
      "would leave some empty");
}

using lamp::distributed::ShardLayout;
using Piece = ShardLayout::Piece;

TEST(ShardLayout, TensorsEndToEndInEvenShardsWithTrailingPadding) {
  // 10 elements over 3 ranks: shards of 4, the last 2 elements padding.
  const ShardLayout layout({3, 5, 2}, 3);
  EXPECT_EQ(layout.numel(), 10);
  EXPECT_EQ(layout.shard_numel(), 4);
  EXPECT_EQ(layout.padded_numel(), 12);
  EXPECT_EQ(layout.offset(0), 0);
  EXPECT_EQ(layout.offset(1), 3);
  EXPECT_EQ(layout.offset(2), 8);
  EXPECT_EQ(layout.pieces(0), (std::vector<Piece>{{0, 0, 0, 3}, {1, 0, 3, 1}}));
  EXPECT_EQ(layout.pieces(1), (std::vector<Piece>{{1, 1, 0, 4}}));
  EXPECT_EQ(layout.pieces(2), (std::vector<Piece>{{2, 0, 0, 2}}));
}

TEST(ShardLayout, EveryElementIsOwnedOnceWhateverTheSizes) {
  // Empty tensors, one rank, more ranks than elements.
  const std::vector<std::vector<int64_t>> cases{
      {7}, {0, 4, 0, 0, 9, 1}, {1, 1}, {}, {1000, 3, 999}};
  for (const auto& numels : cases) {
    for (int world : {1, 2, 3, 4, 7}) {
      const ShardLayout layout(numels, world);
      std::vector<int64_t> owned(static_cast<size_t>(layout.numel()), 0);
      for (int r = 0; r < world; ++r) {
        int64_t in_shard = 0;
        for (const auto& p : layout.pieces(r)) {
          EXPECT_GT(p.length, 0);
          EXPECT_EQ(p.shard_offset, in_shard); // contiguous, in order
          in_shard += p.length;
          for (int64_t e = 0; e < p.length; ++e) {
            ++owned[static_cast<size_t>(layout.offset(p.tensor) +
                                        p.tensor_offset + e)];
          }
        }
        EXPECT_LE(in_shard, layout.shard_numel());
      }
      EXPECT_EQ(std::count(owned.begin(), owned.end(), 1), layout.numel())
          << "world " << world;
      EXPECT_LT(layout.padded_numel() - layout.numel(), world);
    }
  }
}

TEST(ShardLayout, RefusesABadWorldSizeOrRank) {
  EXPECT_NE(lamp_test::error_of([] {
              ShardLayout({1}, 0);
            }).find("the world size must be at least 1, not 0"),
            std::string::npos);
  EXPECT_NE(lamp_test::error_of([] {
              ShardLayout({1, -2}, 1);
            }).find("tensor 1 has a negative number of elements"),
            std::string::npos);
  EXPECT_NE(lamp_test::error_of([] {
              ShardLayout({4}, 2).pieces(2);
            }).find("rank 2 is outside world size 2"),
            std::string::npos);
}

TEST(ProcessGroup, AgreeOfOneProcessRunsTheWorkAndKeepsItsError) {
  // One process has no one to agree with: the work runs once and its error
  // comes back as it was thrown, type and message.
  lamp::distributed::ProcessGroup group;
  int ran = 0;
  group.agree("reading the data", [&] { ++ran; });
  EXPECT_EQ(ran, 1);
  try {
    group.agree("reading the data",
                [] { throw std::runtime_error("the disk is full"); });
    ADD_FAILURE() << "agree() returned";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the disk is full");
  }
  EXPECT_EQ(lamp_test::error_of([&] {
              group.agree("reading the data",
                          [] { TORCH_CHECK(false, "no such file: x.bin."); });
            }),
            "no such file: x.bin.");
}

TEST(ProcessGroup, ShardedCollectivesOfOneProcessCopyAndCheckShapes) {
  lamp::distributed::ProcessGroup group;
  auto shard = torch::arange(4, torch::kFloat);
  auto flat = torch::zeros({4});
  group.all_gather_(flat, shard);
  EXPECT_TRUE(torch::equal(flat, shard));
  auto back = torch::zeros({4});
  group.reduce_scatter_(back, flat);
  EXPECT_TRUE(torch::equal(back, shard));
  auto two_d = torch::zeros({2, 2});
  EXPECT_NE(lamp_test::error_of([&] {
              group.all_gather_(two_d, shard);
            }).find("flat and shard must be 1-D, not of shapes [2, 2] and [4]"),
            std::string::npos);
}

} // namespace
