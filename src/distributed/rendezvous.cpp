#include "distributed/rendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>

#include "distributed/rank_address.h"

namespace lamp {
namespace detail {

std::string error_text(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  std::string text =
      c10_error ? c10_error->what_without_backtrace() : error.what();
  while (!text.empty() &&
         (text.back() == '.' ||
          std::isspace(static_cast<unsigned char>(text.back())))) {
    text.pop_back();
  }
  return text;
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream out;
  out << d.count() / 1000.0 << " s";
  return out.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    out << (i ? ", " : "") << ranks[i];
  }
  if (ranks.size() > 8) {
    out << ", ...";
  }
  return out.str();
}

std::string listener_at(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints,
                    &found) != 0 ||
      found == nullptr) {
    return "the host name " + host + " does not resolve";
  }
  std::string why = "it does not answer";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                 a->ai_protocol);
    if (fd < 0) {
      continue;
    }
    int error = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      socklen_t size = sizeof error;
      error = ::poll(&p, 1, 1000) != 1 ||
                      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0
                  ? ETIMEDOUT
                  : error;
    }
    ::close(fd);
    if (error == 0) {
      ::freeaddrinfo(found);
      return "";
    }
    why = error == ECONNREFUSED ? "nothing listens there (connection refused)"
                                : std::string(std::strerror(error));
  }
  ::freeaddrinfo(found);
  return why;
}

namespace {

// What store_gone() says of rank 0's rendezvous store at host:port.
std::string store_server_gone(const std::string& host, int port,
                              const std::string& address) {
  // A process's sockets close together as it ends: the collective's may be
  // seen closed a moment before the store's listener is. Asked again, for
  // up to 250 ms, before the store counts as there (only a failed or
  // waiting collective asks).
  auto closed = listener_at(host, port);
  for (int again = 0; again < 5 && closed.empty(); ++again) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    closed = listener_at(host, port);
  }
  if (closed.empty()) {
    return "";
  }
  // Refused: the host is there, the store's process is not.
  const bool refused = closed.find("refused") != std::string::npos;
  return "rank 0 has gone without a word (its rendezvous store at " + address +
         ": " + closed + "): " +
         (refused ? ended_process_words()
                  : "its host is down or cannot be reached from here");
}

using distributed::Environment;
using distributed::ProcessGroupOptions;

// The meeting of the ranks before the backend starts: rank 0 (or torchrun's
// agent) serves a TCPStore at MASTER_ADDR:MASTER_PORT, every rank connects
// and signs in under its rank. While it waits, it says for what (every
// wait_report_interval); when the timeout ends the wait, it names the ranks
// that never came.
class Rendezvous {
 public:
  Rendezvous(const Environment& env, const ProcessGroupOptions& options,
             std::string address)
      : env_(env), options_(options), address_(std::move(address)) {}

  RendezvousStore join() const {
    const auto start = Clock::now();
    RendezvousStore joined;
    auto store = connect(start, &joined.connect_again);
    joined.store = store;
    if (!env_.agent_store && env_.rank != 0) {
      joined.server_gone = [host = env_.master_addr, port = env_.master_port,
                            address = address_] {
        return store_server_gone(host, port, address);
      };
    }
    check_job(store);
    // add(), not set(): a rank that another process already signed in under
    // is a second job on this port (or two processes given one RANK).
    const auto signed_in = ask([&] { return store->add(key(env_.rank), 1); });
    TORCH_CHECK(
        signed_in == 1, who(),
        ": another process already joined the "
        "rendezvous at ",
        address_, " as rank ", env_.rank,
        ". Another job uses this MASTER_PORT, or two processes were given "
        "RANK=",
        env_.rank,
        "; choose a free MASTER_PORT (torchrun "
        "--master-port) or give each process its own RANK.");
    ask([&] { return store->add("arrived", 1); });
    wait_for_everyone(*store, start);
    return joined;
  }

 private:
  using Clock = std::chrono::steady_clock;
  // The longest a message's list of absent ranks may take to find.
  static constexpr std::chrono::seconds kScanTime{1};
  // The longest a rendezvous store takes to answer its first call.
  static constexpr std::chrono::seconds kFirstAnswer{10};

  // How often a waiting rank reads ProcessGroupOptions::stop_requested.
  static constexpr std::chrono::milliseconds kStopPoll{100};

  static std::string key(int rank) { return "rank/" + std::to_string(rank); }

  // Who serves the store this rank waits for.
  std::string server() const {
    return env_.agent_store ? "torchrun's agent store" : "rank 0's rendezvous";
  }

  // Why the store is not reached yet, for a client's waiting line: "" when
  // something listens at the address (the store may be starting), else
  // what a connection finds there and what that means.
  std::string why_unreached() const {
    if (!env_.agent_store && env_.rank == 0) {
      return ""; // it serves the store itself
    }
    const auto found = listener_at(env_.master_addr, env_.master_port);
    if (found.empty()) {
      return "";
    }
    return ": " + found +
           (env_.agent_store
                ? "; TORCHELASTIC_USE_AGENT_STORE=True says that torchrun's "
                  "agent serves the store, but none is there. Start the "
                  "ranks with torchrun, or unset "
                  "TORCHELASTIC_USE_AGENT_STORE to let rank 0 serve it"
                : "; rank 0 serves the store once it starts: start it, or "
                  "check MASTER_ADDR and MASTER_PORT");
  }

  // A stop asked for while waiting (ProcessGroupOptions::stop_requested)
  // ends the wait with an error that says so.
  void check_stop(const char* doing) const {
    const auto& stop = options_.stop_requested();
    TORCH_CHECK(!stop || !stop(), who(), ": stopped while waiting to ", doing,
                " at ", address_,
                ", as asked (ProcessGroupOptions::stop_requested: a signal, "
                "in lamp's programs); nothing has run on the group.");
  }

  std::string who() const {
    return "lamp::distributed: rank " + std::to_string(env_.rank) + " of " +
           std::to_string(env_.world_size);
  }

  void report(const std::string& line) const {
    if (options_.wait_report()) {
      options_.wait_report()(line);
    } else {
      std::cerr << line << std::endl;
    }
  }

  [[noreturn]] void fail(const char* doing, const std::exception& e) const {
    const std::string text = error_text(e);
    const bool port_taken = text.find("in use") != std::string::npos;
    TORCH_CHECK(
        false, who(), " ", doing, " the rendezvous at ", address_, " (",
        seconds(options_.timeout()), " timeout): ", text, ". ",
        port_taken
            ? "Another program holds port " + std::to_string(env_.master_port) +
                  "; choose a free MASTER_PORT (torchrun --master-port)."
            : "Check that rank 0 was started (torchrun --nproc-per-node/--nnodes), that MASTER_ADDR:MASTER_PORT is reachable from this host, and that no other job uses the port.");
  }

  // The store, connected (served by rank 0 without torchrun's agent), and
  // in `connect_again` the way to another client connection to it.
  c10::intrusive_ptr<c10d::Store> connect(
      Clock::time_point start,
      std::function<c10::intrusive_ptr<c10d::Store>()>* connect_again) const {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(env_.master_port);
    store_options.isServer = !env_.agent_store && env_.rank == 0;
    store_options.numWorkers = env_.agent_store
                                   ? c10::nullopt
                                   : decltype(store_options.numWorkers)(
                                         static_cast<size_t>(env_.world_size));
    // Rank 0 counts the arrivals itself, saying while it waits.
    store_options.waitWorkers = false;
    store_options.timeout = options_.timeout();
    store_options.multiTenant = true;
    // A client retries until the timeout: in the background, so that this
    // thread can say that it waits. LibTorch 2.x's client waits without a
    // limit for a program on the port that accepts the connection and never
    // answers, hence a thread that may be left behind.
    auto connecting = detached([address = env_.master_addr, store_options] {
      return c10::intrusive_ptr<c10d::Store>(
          c10::make_intrusive<c10d::TCPStore>(address, store_options));
    });
    auto next_report = start + options_.wait_report_interval();
    while (connecting.wait_for(kStopPoll) != std::future_status::ready) {
      check_stop("reach the rendezvous");
      if (Clock::now() < next_report) {
        continue;
      }
      next_report += options_.wait_report_interval();
      TORCH_CHECK(elapsed(start) < options_.timeout() + kFirstAnswer, who(),
                  ": the program at ", address_,
                  " accepted the connection but gave "
                  "no answer in ",
                  seconds(elapsed(start)),
                  ": it is not a rendezvous store. Another program holds "
                  "MASTER_PORT ",
                  env_.master_port,
                  "; choose a free port (torchrun --master-port).");
      report(who() + " waiting to reach " + server() + " at " + address_ +
             " (" + seconds(elapsed(start)) + " of " +
             seconds(options_.timeout()) + ")" + why_unreached());
    }
    c10::intrusive_ptr<c10d::Store> store;
    try {
      store = connecting.get();
    } catch (const std::exception& e) {
      fail(store_options.isServer ? "could not serve" : "could not reach", e);
    }
    // torchrun's agent serves the store, each restart with its own keys;
    // each group of the process has its own keys (every rank makes its
    // groups in the same order).
    static std::atomic<int> groups{0};
    const auto group_keys =
        [agent = env_.agent_store, attempt = env_.restart_count,
         group = groups++,
         timeout = options_.timeout()](c10::intrusive_ptr<c10d::Store> s) {
          if (agent) {
            s = c10::make_intrusive<c10d::PrefixStore>(
                "/worker/attempt_" + std::to_string(attempt), s);
          }
          s = c10::make_intrusive<c10d::PrefixStore>(
              "lamp/pg" + std::to_string(group), s);
          s->setTimeout(timeout);
          return s;
        };
    auto client_options = store_options;
    client_options.isServer = false;
    client_options.numWorkers = c10::nullopt;
    *connect_again = [address = env_.master_addr, client_options, group_keys] {
      return group_keys(
          c10::make_intrusive<c10d::TCPStore>(address, client_options));
    };
    return group_keys(store);
  }

  static std::chrono::milliseconds elapsed(Clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                                 start);
  }

  // A store call; a failure says that the rendezvous was lost.
  template <typename F>
  auto ask(F&& call) const -> decltype(call()) {
    try {
      return call();
    } catch (const std::exception& e) {
      fail("lost", e);
    }
  }

  // The job this rendezvous is for: its size, and torchrun's run id or
  // LAMP_JOB_ID where set. The first rank to arrive writes it; every other
  // compares, so that a rank that reached another job's store says so at
  // once instead of joining it.
  std::string job() const {
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    const char* job_id = std::getenv("LAMP_JOB_ID");
    return "world_size=" + std::to_string(env_.world_size) +
           (job_id != nullptr ? std::string(" job=") + job_id : "") +
           (run_id != nullptr ? std::string(" run_id=") + run_id : "");
  }

  // The store's first answer, within kFirstAnswer: a program on the port
  // that is not a rendezvous store accepts the connection and never
  // answers. (The call runs on a thread of its own, left behind on that
  // error with the store's connection: the error is meant to end the
  // process; one that goes on keeps the connection until it exits.)
  void check_job(const c10::intrusive_ptr<c10d::Store>& store) const {
    const auto mine = job();
    auto found_future = detached([store, mine] {
      const std::vector<uint8_t> none;
      const std::vector<uint8_t> ours(mine.begin(), mine.end());
      return store->compareSet("job", none, ours);
    });
    const auto limit = std::min<std::chrono::milliseconds>(
        options_.timeout(), std::chrono::milliseconds(kFirstAnswer));
    TORCH_CHECK(found_future.wait_for(limit) == std::future_status::ready,
                who(), ": the program at ", address_,
                " accepted the connection but gave "
                "no answer in ",
                seconds(limit),
                ": it is not a rendezvous store. "
                "Another program holds MASTER_PORT ",
                env_.master_port,
                "; choose a free port (torchrun --master-port).");
    const auto found = ask([&] { return found_future.get(); });
    const std::string theirs(found.begin(), found.end());
    TORCH_CHECK(
        theirs == mine, who(), ": the rendezvous at ", address_,
        " belongs to another job (", theirs, "; this rank's is ", mine,
        "). Another job uses this MASTER_PORT, or the ranks were started "
        "with different WORLD_SIZE (or LAMP_JOB_ID); choose a free "
        "MASTER_PORT (torchrun --master-port) and start every rank with the "
        "same variables.");
  }

  // The first few ranks that have not signed in (at most kListed: messages
  // list 8), found in few store calls and never past `deadline`.
  std::vector<int> missing(c10d::Store& store,
                           Clock::time_point deadline) const {
    constexpr size_t kListed = 9;
    std::vector<int> ranks;
    for (int r = 0; r < env_.world_size && ranks.size() < kListed; ++r) {
      if (!ask([&] { return store.check({key(r)}); })) {
        ranks.push_back(r);
      }
      if ((r & 255) == 255 && Clock::now() >= deadline) {
        break;
      }
    }
    return ranks;
  }

  void wait_for_everyone(c10d::Store& store, Clock::time_point start) const {
    auto next_report = start + options_.wait_report_interval();
    int64_t arrived = 0;
    while ((arrived = ask([&] { return store.add("arrived", 0); })) <
           env_.world_size) {
      const auto now = Clock::now();
      const int64_t absent_count = env_.world_size - arrived;
      if (now - start >= options_.timeout()) {
        const auto absent = missing(store, now + kScanTime);
        TORCH_CHECK(
            false, who(), " waited ", seconds(options_.timeout()), " at ",
            address_, " but rank", absent_count > 1 ? "s " : " ",
            rank_list(absent), " never came (", arrived, " of ",
            env_.world_size,
            " arrived). Check that every rank was started with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or give slow starters more time with --dist-timeout (ProcessGroupOptions::timeout).");
      }
      if (now >= next_report) {
        const auto absent = missing(store, now + kScanTime);
        report(who() + " waiting for " + std::to_string(absent_count) + " of " +
               std::to_string(env_.world_size) + " ranks at " + address_ +
               " (rank" + (absent_count > 1 ? "s " : " ") + rank_list(absent) +
               "; " + seconds(elapsed(start)) + " of " +
               seconds(options_.timeout()) + ")");
        next_report = now + options_.wait_report_interval();
      }
      check_stop("meet the other ranks");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const Environment& env_;
  const ProcessGroupOptions& options_;
  std::string address_;
};

} // namespace

RendezvousStore join_rendezvous(const distributed::Environment& env,
                                const distributed::ProcessGroupOptions& options,
                                const std::string& address) {
  return Rendezvous{env, options, address}.join();
}

} // namespace detail
} // namespace lamp
