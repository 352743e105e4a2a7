#pragma once

// The watch over a process group's collectives: while one waits longer than
// a report interval for the other ranks, it says so, and for whom, from a
// thread of its own. Private to src/.

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lamp {
namespace detail {

/// Watches the collectives of one rank. The step pays for a lock and a
/// list entry per collective; no host sync, no store traffic. Only a
/// collective that has waited a report interval costs store round trips,
/// to learn which ranks have not reached it:
///
///   lamp::distributed: rank 0 of 2 has waited 30 s in the gradient
///   all-reduce (bucket 1 of 2) (collective 57) for rank 1, which has not
///   reached it; giving up after 600 s (--dist-timeout /
///   ProcessGroupOptions::timeout).
///
/// A rank whose collective has waited that long writes "wait/RANK" = its
/// collective's number and name into the group's store and deletes it once
/// done; the other ranks' entries tell a rank that waits too (the same
/// number), one in another collective (the ranks call them in different
/// orders) and one that has not come (no entry: stopped, slow or gone);
/// of those that have not come, the ones whose listeners refuse
/// connections (Settings::addresses) are named as gone.
class CollectiveWatch {
 public:
  struct Settings {
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds timeout{0};
    /// The first report after this long, then one each time as long again.
    std::chrono::milliseconds interval{0};
    std::function<void(const std::string&)> report;
    /// Whether the store's server (rank 0) has gone: "" while it is there,
    /// else the words that say so (RendezvousStore::server_gone; empty:
    /// never asked).
    std::function<std::string()> store_gone;
    /// Where the other ranks listen (rank, RankListener::address()): of
    /// the ranks a collective waits for or failed on, the ones found ended
    /// are named (ranks_gone()).
    std::vector<std::pair<int, std::string>> addresses;
    /// This rank's process serves the group's store (rank 0 outside
    /// torchrun): words it leaves go with it when it ends.
    bool serves_store = false;
  };

  /// `connect` makes the watch's own connection to the group's store, as
  /// the watch starts (a TCPStore client serves one call at a time, and the
  /// group's may be blocked in check_same()'s wait for another rank).
  CollectiveWatch(std::function<c10::intrusive_ptr<c10d::Store>()> connect,
                  Settings settings);
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

  /// A collective has started: `what` names it in reports ("the gradient
  /// all-reduce (bucket 1 of 2)"); `work` (null for a store exchange) tells
  /// when it is done. Returns its ticket for end().
  int64_t begin(std::string what, c10::intrusive_ptr<c10d::Work> work);
  /// The caller has waited for ticket `id`. A collective whose work is not
  /// yet complete (NCCL's wait() only orders the stream) stays watched
  /// until it is.
  void end(int64_t id);

  /// begin() and end() for a collective the caller waits for in its scope.
  class Scope {
   public:
    Scope(CollectiveWatch* watch, std::string what,
          c10::intrusive_ptr<c10d::Work> work = {})
        : watch_(watch),
          id_(watch ? watch->begin(std::move(what), std::move(work)) : -1) {}
    ~Scope() {
      if (watch_) {
        watch_->end(id_);
      }
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CollectiveWatch* watch_;
    int64_t id_;
  };

  /// A collective of this rank has failed (another rank stopped): a later
  /// leave_word() leaves nothing.
  void note_collective_failed() const;
  /// For a collective of this rank, `what`, that has failed:
  /// note_collective_failed(), then words_of_stopped_ranks(). Where those
  /// name ranks found ended without a reason (their listeners refuse),
  /// they are left in the store as this rank's reason ("its collective
  /// (what) failed: rank 2 has gone without a word ..."), so that a rank
  /// whose collective fails after this one has ended names the rank that
  /// was gone first, not this one as gone too. Where this rank serves the
  /// store, it then waits until the other ranks have ended (their
  /// listeners refuse), at most 2 s: their collectives fail within
  /// milliseconds of its own, and they read its words as they do.
  std::string words_of_failure(const std::string& what);
  /// Leaves this rank's reason for stopping in the store ("stopped/RANK",
  /// its first 1000 bytes), where the other ranks' reports and failed
  /// collectives read it. Waits at most 2 s; nothing where the store does
  /// not answer, or after a collective of this rank failed. "" takes back
  /// a reason left before (nothing, no store call, where there is none).
  void leave_word(const std::string& why);
  /// The reasons the other ranks left ("rank 1 stopped: ..."), or that
  /// rank 0 has gone without one (Settings::store_gone: its store is
  /// closed; with any other rank found ended), or, where none left one,
  /// which ranks have gone without one (their listeners refuse:
  /// Settings::addresses); "" where none of these is found or the group
  /// is larger than a report reads.
  std::string words_of_stopped_ranks() const;

  /// The interval of ProcessGroupOptions::collective_wait_report() = 0: a
  /// quarter of the timeout, at most 30 s.
  static std::chrono::milliseconds default_interval(
      std::chrono::milliseconds timeout);

 private:
  // words_of_stopped_ranks(), and whether they came from the listeners
  // alone (no reason in the store, rank 0's store there).
  std::string stopped_ranks(bool* from_listeners) const;
  // Writes `why` into the store as this rank's word ("" deletes it).
  void put_word(const std::string& why);

  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

} // namespace detail
} // namespace lamp
