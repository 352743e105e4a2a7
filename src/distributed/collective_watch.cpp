#include "distributed/collective_watch.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "distributed/rank_address.h"
#include "distributed/rendezvous.h"

namespace lamp {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// Ranks whose store entries a report reads; a larger group's report says
// how long it waited, not for whom (one store round trip per rank).
constexpr int kMaxRanksAsked = 256;
// How long a report waits for the store before saying it did not answer
// (rank 0, which serves it, may be the one that stopped).
constexpr std::chrono::seconds kStoreAnswer{2};

std::string key(int rank) {
  return "wait/" + std::to_string(rank);
}

// Where a rank leaves its reason for stopping (CollectiveWatch::leave_word).
std::string stopped_key(int rank) {
  return "stopped/" + std::to_string(rank);
}

// How long the rank that serves the store waits, after leaving what its
// failed collective found, for the other ranks to read it and end.
constexpr std::chrono::seconds kReadersTime{2};

// The longest reason a rank leaves: the first lines of an error.
constexpr size_t kMaxWord = 1000;

// A store entry read in one call that never waits: a compare-set expecting
// a value no entry has answers the entry, or the expected value where there
// is none (TCPStore and HashStore, both LibTorch 1.13 and 2.x, both TCPStore
// servers), and changes nothing. A check, then a get, would wait for the
// store's timeout where the entry goes in between. "" where there is none.
std::string read_entry(c10d::Store& store, const std::string& name) {
  const std::vector<uint8_t> none{0};
  const auto bytes = store.compareSet(name, none, none);
  return bytes == none ? std::string()
                       : std::string(bytes.begin(), bytes.end());
}

std::string whole_seconds(Clock::duration d) {
  return std::to_string(
             std::chrono::duration_cast<std::chrono::seconds>(d).count()) +
         " s";
}

} // namespace

struct CollectiveWatch::State {
  struct Entry {
    int64_t id = 0;
    std::string what;
    c10::intrusive_ptr<c10d::Work> work;
    Clock::time_point start;
    int reports = 0;
    bool waited = false;    // end() was called
    bool announced = false; // this rank's store entry names it
    bool finished() const { return waited && (!work || work->isCompleted()); }
  };

  // The watch's own store connection, made as the watch starts (or on
  // first use, where the store did not answer then); one call at a time.
  class Asker {
   public:
    explicit Asker(std::function<c10::intrusive_ptr<c10d::Store>()> connect)
        : connect_(std::move(connect)) {}
    template <typename F>
    auto ask(F call) -> decltype(call(std::declval<c10d::Store&>())) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!store_) {
        store_ = connect_();
      }
      return call(*store_);
    }

   private:
    std::mutex mutex_;
    std::function<c10::intrusive_ptr<c10d::Store>()> connect_;
    c10::intrusive_ptr<c10d::Store> store_;
  };

  std::shared_ptr<Asker> asker;
  Settings settings;
  // A collective of this rank has failed: its error is the other ranks'
  // stop, no reason of its own to leave them.
  std::atomic<bool> collective_failed{false};
  // This rank's reason is in the store (leave_word("") takes it back).
  std::atomic<bool> word_left{false};
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Entry> pending; // in ticket order
  int64_t next_id = 0;
  bool stop = false;
  // The thread has left its loop (the destructor waits for it, bounded).
  std::promise<void> done;

  // Finished entries at the front go; those announced leave a store entry
  // to delete (returned).
  std::vector<int64_t> prune_locked() {
    std::vector<int64_t> announced;
    while (!pending.empty() && pending.front().finished()) {
      if (pending.front().announced) {
        announced.push_back(pending.front().id);
      }
      pending.pop_front();
    }
    return announced;
  }

  // What the store holds of another rank: its entry (the collective it
  // waits in) and the reason it left for stopping.
  struct Seen {
    std::string entry;
    std::string word;
  };
  using Entries = std::vector<Seen>;

  // Who the collective numbered `id` waits for, from the other ranks' store
  // entries, as the report's words ("for rank 1"); runs off the lock.
  std::string whom(int64_t id, const std::string& what) const {
    const int world = settings.world_size;
    if (world > kMaxRanksAsked) {
      return "for the other ranks";
    }
    const int rank = settings.rank;
    auto answer = detached([asker = asker, rank, world, id, what] {
      return asker->ask([&](c10d::Store& store) {
        const std::string mine = std::to_string(id) + "\t" + what;
        store.set(key(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
        Entries others(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) {
          if (r != rank) {
            others[static_cast<size_t>(r)] = {
                read_entry(store, key(r)), read_entry(store, stopped_key(r))};
          }
        }
        return others;
      });
    });
    if (answer.wait_for(kStoreAnswer) != std::future_status::ready) {
      const auto gone = store_gone();
      return "for the other ranks; " +
             (gone.empty() ? "rank 0's store gave no answer in " +
                                 whole_seconds(kStoreAnswer) +
                                 ": rank 0 may have stopped"
                           : gone);
    }
    Entries entries;
    try {
      entries = answer.get();
    } catch (const std::exception& e) {
      const auto gone = store_gone();
      return "for the other ranks; " +
             (gone.empty() ? "rank 0's store: " + error_text(e) : gone);
    }
    std::vector<int> absent;
    // The absent ranks that left no reason, where they listen.
    std::vector<std::pair<int, std::string>> silent;
    std::ostringstream elsewhere;
    // Another collective, or the same number under another name.
    const std::string here = std::to_string(id) + "\t" + what;
    for (int r = 0; r < world; ++r) {
      if (r == settings.rank) {
        continue;
      }
      const auto& entry = entries[static_cast<size_t>(r)].entry;
      const auto& word = entries[static_cast<size_t>(r)].word;
      // A rank that stopped will not come, whatever its entry says.
      if (!word.empty()) {
        elsewhere << "; rank " << r << " stopped: " << word;
      }
      if (entry.empty() || !word.empty()) {
        absent.push_back(r);
        const auto& address = address_of(r);
        if (word.empty() && !address.empty()) {
          silent.emplace_back(r, address);
        }
      } else if (entry != here) {
        const auto tab = entry.find('\t');
        elsewhere << "; rank " << r << " waits in collective "
                  << entry.substr(0, tab) << ", "
                  << (tab == std::string::npos ? "" : entry.substr(tab + 1))
                  << ": the ranks call collectives in different orders";
      }
    }
    std::string text =
        absent.empty()
            ? "for the other ranks"
            : std::string("for rank") + (absent.size() > 1 ? "s " : " ") +
                  rank_list(absent) +
                  (absent.size() > 1 ? ", which have" : ", which has") +
                  " not reached it";
    // Which of them has ended (killed outright, or crashed).
    const auto gone = ranks_gone(silent);
    return text + elsewhere.str() + (gone.empty() ? "" : "; " + gone);
  }

  // Where rank r listens (Settings::addresses), "" where it is not known.
  std::string address_of(int r) const {
    for (const auto& [rank, address] : settings.addresses) {
      if (rank == r) {
        return address;
      }
    }
    return "";
  }

  // Settings::store_gone's words, "" where it is not set.
  std::string store_gone() const {
    return settings.store_gone ? settings.store_gone() : std::string();
  }

  void forget(const std::vector<int64_t>& announced) const {
    if (announced.empty()) {
      return;
    }
    const int rank = settings.rank;
    // Not waited for: a store that does not answer must not hold the watch.
    detached([asker = asker, rank] {
      return asker->ask(
          [rank](c10d::Store& store) { return store.deleteKey(key(rank)); });
    });
  }

  void run() {
    const auto poll = std::clamp<std::chrono::milliseconds>(
        settings.interval / 4, std::chrono::milliseconds(50),
        std::chrono::seconds(1));
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      wake.wait_for(lock, poll);
      if (stop) {
        break;
      }
      const auto announced = prune_locked();
      if (!announced.empty()) {
        lock.unlock();
        forget(announced);
        lock.lock();
        continue;
      }
      if (pending.empty()) {
        continue;
      }
      // The oldest collective: the one every later one waits behind.
      auto& oldest = pending.front();
      const auto waited = Clock::now() - oldest.start;
      if (oldest.finished() ||
          waited < settings.interval * (oldest.reports + 1)) {
        continue;
      }
      ++oldest.reports;
      oldest.announced = true;
      const int64_t id = oldest.id;
      const std::string what = oldest.what;
      lock.unlock();
      const std::string line =
          "lamp::distributed: rank " + std::to_string(settings.rank) + " of " +
          std::to_string(settings.world_size) + " has waited " +
          whole_seconds(waited) + " in " + what + " (collective " +
          std::to_string(id) + ") " + whom(id, what) + "; giving up after " +
          seconds(settings.timeout) +
          " (--dist-timeout / ProcessGroupOptions::timeout).";
      settings.report(line);
      lock.lock();
    }
  }
};

void CollectiveWatch::note_collective_failed() const {
  state_->collective_failed = true;
}

void CollectiveWatch::leave_word(const std::string& why) {
  if (why.empty() ? !state_->word_left.exchange(false)
                  : state_->collective_failed.load()) {
    return; // no word to take back, or no reason of this rank's own
  }
  put_word(why);
}

void CollectiveWatch::put_word(const std::string& why) {
  const int rank = state_->settings.rank;
  const std::string word = why.substr(0, kMaxWord);
  auto done = detached([asker = state_->asker, rank, word] {
    asker->ask([&](c10d::Store& store) {
      if (word.empty()) {
        store.deleteKey(stopped_key(rank));
      } else {
        store.set(stopped_key(rank),
                  std::vector<uint8_t>(word.begin(), word.end()));
      }
    });
    return true;
  });
  state_->word_left = !word.empty();
  // Not an error where the store does not answer: the word is a courtesy.
  if (done.wait_for(kStoreAnswer) == std::future_status::ready) {
    try {
      done.get();
    } catch (const std::exception&) {
    }
  }
}

std::string CollectiveWatch::words_of_failure(const std::string& what) {
  note_collective_failed();
  bool from_listeners = false;
  const auto words = stopped_ranks(&from_listeners);
  if (!from_listeners || words.empty()) {
    return words;
  }
  // Found by this rank alone: left for the others, with "than this rank"
  // said of this one. Not a reason of its own: the next fit() takes it
  // back as any other (leave_word("")).
  const auto here = ended_process_words();
  const auto there =
      ended_process_words("rank " + std::to_string(state_->settings.rank));
  std::string word = "its collective (" + what + ") failed: " + words;
  for (auto at = word.find(here); at != std::string::npos;
       at = word.find(here, at + there.size())) {
    word.replace(at, here.size(), there);
  }
  put_word(word);
  if (state_->settings.serves_store) {
    // Its process ending takes the store, and the words, with it.
    const auto until = Clock::now() + kReadersTime;
    while (Clock::now() < until && !ranks_ended(state_->settings.addresses)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return words;
}

std::string CollectiveWatch::words_of_stopped_ranks() const {
  return stopped_ranks(nullptr);
}

std::string CollectiveWatch::stopped_ranks(bool* from_listeners) const {
  const int rank = state_->settings.rank;
  const int world = state_->settings.world_size;
  if (world > kMaxRanksAsked) {
    return "";
  }
  const auto& addresses = state_->settings.addresses;
  // Rank 0 gone: no store to read the reasons from (its own, if it left
  // one, went with it), and a connection to it would wait in vain. Rank 0
  // may have ended on a failed collective of its own: any other rank found
  // ended is named too.
  const auto with_others_gone = [&addresses](const std::string& gone) {
    std::vector<std::pair<int, std::string>> others;
    for (const auto& entry : addresses) {
      if (entry.first != 0) {
        others.push_back(entry);
      }
    }
    const auto more = ranks_gone(
        others, gone.find(ended_process_words()) != std::string::npos);
    return more.empty() ? gone : gone + "; " + more;
  };
  const auto gone = state_->store_gone();
  if (!gone.empty()) {
    return with_others_gone(gone);
  }
  auto answer = detached([asker = state_->asker, rank, world] {
    return asker->ask([&](c10d::Store& store) {
      std::string words;
      for (int r = 0; r < world; ++r) {
        if (r == rank) {
          continue;
        }
        const auto word = read_entry(store, stopped_key(r));
        if (!word.empty()) {
          words += (words.empty() ? "rank " : "; rank ") + std::to_string(r) +
                   " stopped: " + word;
        }
      }
      return words;
    });
  });
  std::string words;
  if (answer.wait_for(kStoreAnswer) == std::future_status::ready) {
    try {
      words = answer.get();
    } catch (const std::exception&) {
      // Gone in between, or another store error: the listeners tell.
    }
  }
  if (!words.empty()) {
    return words;
  }
  // No reason left: which ranks have ended without one (killed outright).
  const auto gone_since = state_->store_gone();
  if (!gone_since.empty()) {
    return with_others_gone(gone_since);
  }
  if (from_listeners != nullptr) {
    *from_listeners = true;
  }
  return ranks_gone(addresses);
}

std::chrono::milliseconds CollectiveWatch::default_interval(
    std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(timeout / 4,
                                             std::chrono::seconds(30));
}

CollectiveWatch::CollectiveWatch(
    std::function<c10::intrusive_ptr<c10d::Store>()> connect, Settings settings)
    : state_(std::make_shared<State>()) {
  TORCH_INTERNAL_ASSERT(settings.interval.count() > 0 && settings.report);
  state_->asker = std::make_shared<State::Asker>(std::move(connect));
  state_->settings = std::move(settings);
  // Connected now, while rank 0 is surely there. LibTorch 1.13's TCPStore
  // client runs a thread that ends the process (std::terminate, "Connection
  // reset by peer") when the server dies with the client's connection
  // still in its backlog, which a connection made as a collective fails
  // (rank 0 dying) can be: 1 of 25 killed rank 0s ended so. Bounded: a store that
  // does not answer leaves the connection to the first use.
  auto connected = detached([asker = state_->asker] {
    return asker->ask([](c10d::Store& /*store*/) { return true; });
  });
  connected.wait_for(kStoreAnswer);
  try {
    thread_ = std::thread([state = state_] {
      state->run();
      state->done.set_value();
    });
  } catch (const std::system_error& error) {
    TORCH_CHECK(false, "rank ", state_->settings.rank, " of ",
                state_->settings.world_size, ": ",
                thread_refused("watch its collectives", error));
  }
}

CollectiveWatch::~CollectiveWatch() {
  auto done = state_->done.get_future();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  // A report blocked on a store that does not answer is left behind; it
  // holds the state, not this object.
  if (done.wait_for(kStoreAnswer * 2) == std::future_status::ready) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

int64_t CollectiveWatch::begin(std::string what,
                               c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State::Entry entry;
  entry.id = state_->next_id++;
  entry.what = std::move(what);
  entry.work = std::move(work);
  entry.start = Clock::now();
  state_->pending.push_back(std::move(entry));
  return state_->pending.back().id;
}

void CollectiveWatch::end(int64_t id) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto& pending = state_->pending;
  const auto it =
      std::find_if(pending.begin(), pending.end(),
                   [id](const State::Entry& e) { return e.id == id; });
  if (it == pending.end()) {
    return;
  }
  it->waited = true;
  // Announced entries are the thread's to remove (it deletes their store
  // entry); the others go as soon as they are done.
  if (!it->announced && it->finished()) {
    pending.erase(it);
  }
}

} // namespace detail
} // namespace lamp
