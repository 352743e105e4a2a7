#pragma once

// Where each rank of a group can be found alive: a listening socket that
// lives as long as the rank's process, so that a rank killed outright (a
// signal, the out-of-memory killer, a crash) is named by the others, whose
// connections to it are then refused. Private to src/.

#include <string>
#include <utility>
#include <vector>

namespace lamp {
namespace detail {

/// A TCP socket of this rank's that listens and accepts nothing: while the
/// process lives, the kernel completes a connection to it (into its
/// backlog); once the process has ended, a connection is refused. It
/// listens on the address from which this host reaches `host`:`port` (the
/// rendezvous, MASTER_ADDR:MASTER_PORT), which the other ranks reach too,
/// at a port the system picks. Closed on destruction, and in a child the
/// process execs (close-on-exec).
class RankListener {
 public:
  RankListener() = default;
  /// One listening as above; none (address() "") where the system gives
  /// none (no route to `host`, no socket): a rank without one is only never
  /// named as gone.
  static RankListener open(const std::string& host, int port);
  ~RankListener();
  RankListener(RankListener&& other) noexcept;
  RankListener& operator=(RankListener&& other) noexcept;
  RankListener(const RankListener&) = delete;
  RankListener& operator=(const RankListener&) = delete;

  /// "HOST:PORT" ("[HOST]:PORT" for IPv6), or "" where none listens.
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

/// The words for a process found ended, after "... has gone without a word
/// (...): ": "its process has ended, killed (by a signal, or by the
/// out-of-memory killer: see the system log, dmesg), crashed, or done with
/// fewer collectives than this rank" (`than`: the rank that found it, in
/// words another rank reads).
std::string ended_process_words(const std::string& than = "this rank");

/// What connections to other ranks' listeners (rank, RankListener::address)
/// find, all at once (at most a second each, asked again for up to 250 ms
/// where every one answers, as a process's sockets close together), "; "
/// between ranks: "rank 2 has gone without a word (its address
/// 10.0.0.3:41234: nothing listens there (connection refused)): " and
/// ended_process_words() for the first refused, "so has rank 3 (its
/// address ...: ...)" for each one after it (each one where `explained`:
/// the words came before), "rank 4 does not answer at its address ... (...):
/// its host may be down, or cannot be reached from here" for each that does
/// not answer; "" where every one accepts.
std::string ranks_gone(const std::vector<std::pair<int, std::string>>& ranks,
                       bool explained = false);

/// Whether every one of `ranks`' listeners refuses connections: their
/// processes have all ended (true where there are none).
bool ranks_ended(const std::vector<std::pair<int, std::string>>& ranks);

} // namespace detail
} // namespace lamp
