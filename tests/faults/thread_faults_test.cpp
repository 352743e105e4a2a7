// Threads the system refuses to start (fault-injection tests, ctest label
// `faults`; liblamp_fail_io preloaded, whose lamp_fail_threads_after(N) lets
// N more pthread_create() calls through and fails the rest with EAGAIN, as
// `ulimit -u` does): write_token_files() gives the same token files on the
// threads that started, or on the calling thread, with one warning naming
// the limit, where it ended the process (std::terminate) or threw the
// system's bare words.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "compress_util.h"
#include "distributed/collective_watch.h"
#include "distributed/rank_address.h"
#include "distributed/rendezvous.h"
#include "lamp/data/token_writer.h"
#include "lamp/data/tokenizer.h"
#include "lamp/platform/warnings.h"
#include "platform/worker_threads.h"
#include "test_util.h"

extern "C" void lamp_fail_threads_after(long long n) __attribute__((weak));

namespace {

using lamp::data::BytePairEncoding;
using lamp::data::TokenFileOptions;
using lamp::data::write_token_files;

// For its lifetime, `n` more threads start and the rest are refused.
class ThreadLimit {
 public:
  explicit ThreadLimit(long long n) { lamp_fail_threads_after(n); }
  ~ThreadLimit() { lamp_fail_threads_after(-1); }
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;
};

class ThreadFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(lamp_fail_threads_after, nullptr)
        << "run with LD_PRELOAD naming liblamp_fail_io (ctest does)";
  }
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

// Lines of words, numbers and punctuation: many places to cut.
std::string text_of(int lines, int seed) {
  std::string text;
  for (int k = 0; k < lines; ++k) {
    text += "Line " + std::to_string(k * 7919 + seed) + " of the lamp, " +
            (k % 3 == 0 ? "isn't it?" : "it is.") + "\n";
  }
  return text;
}

TEST_F(ThreadFaults, WorkersThatCannotStartLeaveTheWorkToThoseThatDid) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  const int64_t jobs = 1000;
  const auto work = [&](int64_t /*worker*/) {
    for (int64_t k = next++; k < jobs; k = next++) {
      ++done;
    }
  };
  lamp::detail::Workers workers;
  {
    ThreadLimit limit(2);
    EXPECT_EQ(workers.start(5, work), 2);
  }
  EXPECT_FALSE(workers.refused().empty());
  workers.join();
  EXPECT_EQ(done.load(), jobs);
  // All start where the system lets them; the words of the last refusal go.
  next = 0;
  done = 0;
  EXPECT_EQ(workers.start(3, work), 3);
  EXPECT_EQ(workers.refused(), "");
  workers.join();
  EXPECT_EQ(done.load(), jobs);
  EXPECT_EQ(workers.start(0, work), 0);
}

TEST_F(ThreadFaults, TokenFilesAreWrittenOnTheThreadsThatStarted) {
  if (!lamp::data::byte_pair_encode_available()) {
    GTEST_SKIP() << "lamp was built without ICU";
  }
  lamp_test::ScratchFolder scratch("lamp_threads", "tokens");
  const lamp::data::Tokenizer gpt2 = BytePairEncoding::load(
      LAMP_SOURCE_DIR "/tests/python/byte_pair/tokenizer.json");
  // Two shards of two gzip members each: a member's size is not the
  // text's, so the sizes are counted, on a thread per shard; then the text
  // is encoded in pieces of 64 bytes on 3 threads.
  const auto a = text_of(300, 1);
  const auto b = text_of(200, 2);
  scratch.write("shards/a.txt.gz", lamp_test::gzip(a.substr(0, 5000)) +
                                       lamp_test::gzip(a.substr(5000)));
  scratch.write("shards/b.txt.gz", lamp_test::gzip(b.substr(0, 3000)) +
                                       lamp_test::gzip(b.substr(3000)));
  const auto options = TokenFileOptions().threads(3).chunk_bytes(64);
  const auto expected = write_token_files(scratch.path("shards"), gpt2,
                                          scratch.path("all"), options);
  EXPECT_EQ(expected.threads, 3);
  // One thread more, then none; and none at all.
  for (const long long allowed : {1LL, 0LL}) {
    SCOPED_TRACE(std::to_string(allowed) + " more threads");
    const auto out = scratch.path("limited" + std::to_string(allowed));
    std::vector<std::string> warnings;
    lamp::data::TokenFileSummary written;
    {
      lamp::WarningSink sink([&warnings](const std::string& message) {
        warnings.push_back(message);
      });
      ThreadLimit limit(allowed);
      written = write_token_files(scratch.path("shards"), gpt2, out, options);
    }
    EXPECT_EQ(read(out + "/train.bin"), read(scratch.path("all/train.bin")));
    EXPECT_EQ(read(out + "/val.bin"), read(scratch.path("all/val.bin")));
    EXPECT_EQ(written.train_tokens, expected.train_tokens);
    EXPECT_EQ(written.validation_tokens, expected.validation_tokens);
    EXPECT_EQ(written.threads, 1);
    // One warning a call (the encoding, the count, the encoding again all
    // start fewer), naming the system's words and the fix.
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find(" of 3 threads started to encode (the system "
                               "refused the next: "),
              std::string::npos)
        << warnings[0];
    EXPECT_NE(warnings[0].find("Give fewer threads"), std::string::npos)
        << warnings[0];
  }
}

// The process group's helpers: a store call on a thread of its own
// (detached()) holds the refusal in its future, as it holds a store's error,
// where it threw std::system_error at its caller (on the collective watch's
// thread: std::terminate); the watch of a new group says what refused it.
TEST_F(ThreadFaults, TheProcessGroupsHelpersNameARefusedThread) {
  const std::string words =
      "the system would not start a thread to ask the ranks' store "
      "(Resource temporarily unavailable): a limit on the processes' "
      "threads or memory is reached (ulimit -u, ulimit -v, a container's "
      "pids limit); raise it, or run fewer processes or threads.";
  {
    std::future<int> answer;
    {
      ThreadLimit limit(0);
      answer = lamp::detail::detached([] { return 7; });
    }
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(0)),
              std::future_status::ready);
    try {
      answer.get();
      ADD_FAILURE() << "a refused thread gave an answer";
    } catch (const c10::Error& e) {
      EXPECT_EQ(lamp::detail::error_text(e), words.substr(0, words.size() - 1));
    }
  }
  EXPECT_EQ(lamp::detail::detached([] { return 7; }).get(), 7);
  // The probes of the other ranks' listeners (on the watch's thread, and in
  // a failed collective's report): a rank no probe could reach is not
  // called gone, and nothing is thrown, where the refusal escaped them.
  // 127.0.0.1:1: nothing listens there, which a probe that ran would say.
  const std::vector<std::pair<int, std::string>> ranks = {{1, "127.0.0.1:1"}};
  {
    ThreadLimit limit(0);
    EXPECT_EQ(lamp::detail::ranks_gone(ranks), "");
  }
  EXPECT_NE(lamp::detail::ranks_gone(ranks).find("rank 1 has gone without a "
                                                 "word (its address "
                                                 "127.0.0.1:1: nothing "
                                                 "listens there"),
            std::string::npos);

  lamp::detail::CollectiveWatch::Settings settings;
  settings.rank = 1;
  settings.world_size = 2;
  settings.timeout = std::chrono::seconds(60);
  settings.interval = std::chrono::seconds(30);
  settings.report = [](const std::string& /*line*/) {};
  const auto store = c10::make_intrusive<c10d::HashStore>();
  const auto connect = [store] {
    return c10::intrusive_ptr<c10d::Store>(store);
  };
  try {
    ThreadLimit limit(0);
    lamp::detail::CollectiveWatch watch(connect, settings);
    ADD_FAILURE() << "the watch started without its thread";
  } catch (const c10::Error& e) {
    EXPECT_EQ(lamp::detail::error_text(e),
              "rank 1 of 2: the system would not start a thread to watch its "
              "collectives (Resource temporarily unavailable): a limit on "
              "the processes' threads or memory is reached (ulimit -u, "
              "ulimit -v, a container's pids limit); raise it, or run fewer "
              "processes or threads");
  }
  // With room, the same watch starts and ends.
  lamp::detail::CollectiveWatch watch(connect, settings);
}

} // namespace
