#include "distributed/rank_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "distributed/rendezvous.h"

namespace lamp {
namespace detail {
namespace {

// How long the probes of ranks_gone() wait in all for their answers.
constexpr std::chrono::milliseconds kProbeTime{2000};

// "HOST:PORT" of a socket address ("[HOST]:PORT" for IPv6), "" if none.
std::string address_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(address);
    if (::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host) == nullptr) {
      return "";
    }
    return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
    if (::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host) == nullptr) {
      return "";
    }
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  return "";
}

// The local address from which this host reaches host:port: a UDP socket's
// connect() picks the route and sends nothing. Family AF_UNSPEC where none.
sockaddr_storage route_to(const std::string& host, int port) {
  sockaddr_storage local{};
  local.ss_family = AF_UNSPEC;
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints,
                    &found) != 0 ||
      found == nullptr) {
    return local;
  }
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      continue;
    }
    socklen_t size = sizeof local;
    const bool routed =
        ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) == 0;
    ::close(fd);
    if (routed) {
      break;
    }
    local.ss_family = AF_UNSPEC;
  }
  ::freeaddrinfo(found);
  return local;
}

// "HOST" and PORT of "HOST:PORT" or "[HOST]:PORT"; false where it is not.
bool split_address(const std::string& address, std::string& host, int& port) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return false;
  }
  host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    return false;
  }
  return !host.empty() && port > 0 && port < 65536;
}

// listener_at() for each rank's address at once: what each found ("" where
// something accepts, or where no probe could start: a rank is not called
// gone unless a probe found it so; a rank whose probe did not end in time:
// "it does not answer"). Never throws: it runs on the collective watch's
// thread and inside an error's report.
std::vector<std::string> probe_listeners(
    const std::vector<std::pair<int, std::string>>& ranks) {
  std::vector<std::future<std::string>> answers;
  for (const auto& [rank, address] : ranks) {
    answers.push_back(detached(
        [address = address] {
          std::string host;
          int port = 0;
          return split_address(address, host, port) ? listener_at(host, port)
                                                    : std::string();
        },
        "probe whether a rank still listens"));
  }
  const auto deadline = std::chrono::steady_clock::now() + kProbeTime;
  std::vector<std::string> found;
  for (auto& answer : answers) {
    if (answer.wait_until(deadline) != std::future_status::ready) {
      found.emplace_back("it does not answer");
      continue;
    }
    try {
      found.push_back(answer.get());
    } catch (const std::exception&) {
      found.emplace_back(); // no thread to probe with: not known gone
    }
  }
  return found;
}

} // namespace

RankListener RankListener::open(const std::string& host, int port) {
  RankListener listener;
  auto local = route_to(host, port);
  // A link-local IPv6 address is reached only through its interface, which
  // the address's text does not carry: none, rather than one the others
  // would find unreachable.
  if ((local.ss_family != AF_INET && local.ss_family != AF_INET6) ||
      (local.ss_family == AF_INET6 &&
       IN6_IS_ADDR_LINKLOCAL(
           &reinterpret_cast<const sockaddr_in6&>(local).sin6_addr))) {
    return listener;
  }
  // Any port: the system's pick, read back below.
  socklen_t size =
      local.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (local.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in&>(local).sin_port = 0;
  } else {
    reinterpret_cast<sockaddr_in6&>(local).sin6_port = 0;
  }
  const int fd = ::socket(local.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return listener;
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&local), size) != 0 ||
      ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) != 0) {
    ::close(fd);
    return listener;
  }
  listener.fd_ = fd;
  listener.address_ = address_text(local);
  return listener;
}

RankListener::~RankListener() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

RankListener::RankListener(RankListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), address_(std::move(other.address_)) {}

RankListener& RankListener::operator=(RankListener&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = std::exchange(other.fd_, -1);
    address_ = std::move(other.address_);
  }
  return *this;
}

std::string ended_process_words(const std::string& than) {
  return "its process has ended, killed (by a signal, or by the "
         "out-of-memory killer: see the system log, dmesg), crashed, or "
         "done with fewer collectives than " +
         than;
}

bool ranks_ended(const std::vector<std::pair<int, std::string>>& ranks) {
  for (const auto& found : probe_listeners(ranks)) {
    if (found.find("refused") == std::string::npos) {
      return false;
    }
  }
  return true;
}

std::string ranks_gone(const std::vector<std::pair<int, std::string>>& ranks,
                       bool explained) {
  if (ranks.empty()) {
    return "";
  }
  auto found = probe_listeners(ranks);
  const auto none = [&found] {
    for (const auto& f : found) {
      if (!f.empty()) {
        return false;
      }
    }
    return true;
  };
  // A process's sockets close together as it ends: the collective's may be
  // seen closed a moment before its listener is.
  for (int again = 0; again < 5 && none(); ++again) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    found = probe_listeners(ranks);
  }
  std::string words;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (found[i].empty()) {
      continue;
    }
    const auto rank = "rank " + std::to_string(ranks[i].first);
    const auto& address = ranks[i].second;
    words += words.empty() ? "" : "; ";
    const auto where = "(its address " + address + ": " + found[i] + ")";
    if (found[i].find("refused") == std::string::npos) {
      words += rank + " does not answer at its address " + address + " (" +
               found[i] +
               "): its host may be down, or cannot be reached from here";
    } else if (explained) {
      words += "so has " + rank + " " + where; // what that means, once
    } else {
      words += rank + " has gone without a word " + where + ": " +
               ended_process_words();
      explained = true;
    }
  }
  return words;
}

} // namespace detail
} // namespace lamp
