// The CUDA emulator's runtime (tests/emulated_cuda/prelude.h): a launch runs
// its blocks one after another; a block's threads are fibers (ucontext) on
// the calling host thread, each running until it reaches a barrier or ends.
// Between two of the block's __syncthreads, its warps run one after another,
// each as far as it goes (its shuffles complete among its 32 lanes), so
// that one warp gets ahead of the rest as a GPU lets it; then every thread
// that has not ended goes on from the barrier (an ended one counts as
// arrived, as on a GPU). Warps and lanes run in index order in even blocks
// and in reverse order in odd ones, so that a read of another thread's
// write with no barrier between them sees the wrong value in one block or
// the other.
// A fiber switch is a _setjmp/_longjmp between stacks, which glibc's
// fortified longjmp would refuse.
#undef _FORTIFY_SOURCE
#include "emulated_cuda/emulator.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if !defined(__SANITIZE_ADDRESS__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define LAMP_EMU_ASAN 1
#else
#define LAMP_EMU_ASAN 0
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "emulated_cuda/prelude.h"

namespace lamp_emu {
namespace {

// The bytes a thread's stack takes: lamp's kernels keep a few dozen values
// each.
constexpr std::size_t kStackBytes = 64 * 1024;
// What a kernel's parameters may take on every architecture (CUDA 12.1 and
// later allow more on Volta and newer; lamp's kernels keep to this).
constexpr std::size_t kParameterBytes = 4096;
// Shared memory's bytes at each block's start: all ones, a NaN in FP32,
// FP16 and BF16, so that a read of a value no thread wrote shows.
constexpr unsigned char kGarbage = 0xff;

enum class State { kReady, kAtSyncthreads, kAtShuffle, kDone };

// A fiber starts on its own stack through makecontext and swapcontext, once
// a launch (swapcontext saves the signal mask, a system call); after that,
// switches are _setjmp/_longjmp, which do not, and the fiber runs the
// kernel once for each block.
struct Fiber {
  ucontext_t context;
  jmp_buf resume;
  bool started = false;
  char* stack = nullptr; // one of g_stacks
  // Where the fiber waits at __syncthreads: the call's source line.
  const char* barrier_file = "";
  int barrier_line = 0;
  // Under AddressSanitizer, the fiber's fake frames while it is switched
  // out. They are never freed (a fiber is left where it waits at the end of
  // a launch), which matters only with detect_stack_use_after_return=1, off
  // in scripts/sanitize.sh.
  void* asan_fake_stack = nullptr;
  State state = State::kReady;
  Context indices;
  unsigned linear = 0;
};

struct Launch {
  Config config{dim3(1), dim3(1)};
  void (*body)(void*) = nullptr;
  void* state = nullptr;
  std::vector<Fiber> fibers;
  std::vector<unsigned long long> exchange; // 32 slots a warp
  std::vector<unsigned char> dynamic_shared;
  std::map<const void*, std::size_t> shared;  // every block's, by address
  std::map<const void*, bool> shared_touched; // this block's
  std::string failure;
};

ucontext_t g_scheduler;
// The fibers' stacks, kept from launch to launch (a launch of 256 threads
// would otherwise allocate, and its first use of each page fault in, 16
// MiB), each above a page that may not be touched: a kernel that overflows
// its stack stops there with SIGSEGV instead of writing over the heap.
std::vector<char*> g_stacks;

char* new_stack() {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (base == MAP_FAILED || mprotect(base, page, PROT_NONE) != 0) {
    std::fprintf(stderr, "lamp_emu: no memory for a thread's stack\n");
    std::abort();
  }
  return static_cast<char*>(base) + page;
}
jmp_buf g_scheduler_resume;
// Under AddressSanitizer, each switch between stacks is announced to it
// (scripts/sanitize.sh): the host thread's stack, as the first switch into
// a fiber reports it, and the scheduler's fake stack.
const void* g_host_stack_bottom = nullptr;
std::size_t g_host_stack_size = 0;
void* g_scheduler_fake_stack = nullptr;

// About to run on `bottom`'s stack, saving the current stack's fake frames
// in *fake (LAMP_EMU_ASAN only).
void start_switch(void** fake, const void* bottom, std::size_t size) {
#if LAMP_EMU_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}

// Now running on the stack switched to.
void finish_switch(void* fake, const void** old_bottom, std::size_t* old_size) {
#if LAMP_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, old_bottom, old_size);
#else
  (void)fake, (void)old_bottom, (void)old_size;
#endif
}
Launch* g_launch = nullptr;
Fiber* g_current = nullptr;
cudaError_t g_last_error = cudaSuccess;
std::string g_last_message;
std::int64_t g_launches = 0;

std::string describe(const dim3& d) {
  std::ostringstream out;
  out << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return out.str();
}

std::string describe(const uint3& d) {
  return describe(dim3(d.x, d.y, d.z));
}

Fiber& running(const char* what) {
  if (g_launch == nullptr || g_current == nullptr) {
    std::fprintf(stderr, "lamp_emu: %s called outside a kernel\n", what);
    std::abort();
  }
  return *g_current;
}

// Runs `f` until it waits at a barrier or ends. Never inlined: no caller's
// variable lives in the frame that _setjmp saves.
__attribute__((noinline)) void resume(Fiber& f) {
  g_current = &f;
  if (_setjmp(g_scheduler_resume) == 0) {
    start_switch(&g_scheduler_fake_stack, f.stack, kStackBytes);
    if (!f.started) {
      f.started = true;
      swapcontext(&g_scheduler, &f.context);
    } else {
      _longjmp(f.resume, 1);
    }
  }
  finish_switch(g_scheduler_fake_stack, nullptr, nullptr);
  g_current = nullptr;
}

// Back to the scheduler from the running fiber `f`.
[[noreturn]] void to_scheduler(Fiber& f) {
  start_switch(&f.asan_fake_stack, g_host_stack_bottom, g_host_stack_size);
  _longjmp(g_scheduler_resume, 1);
}

// The running fiber waits: back to the scheduler until it is resumed.
__attribute__((noinline)) void yield(Fiber& f) {
  if (_setjmp(f.resume) == 0) {
    to_scheduler(f);
  }
  finish_switch(f.asan_fake_stack, nullptr, nullptr);
}

// Ends the running thread's block: the launch fails with `why`.
[[noreturn]] void fail(const std::string& why) {
  g_launch->failure = why;
  g_current->state = State::kDone;
  to_scheduler(*g_current); // never resumed
}

// A fiber's life: the kernel's body once for each block of the launch.
[[noreturn]] void trampoline() {
  finish_switch(nullptr, &g_host_stack_bottom, &g_host_stack_size);
  for (;;) {
    g_launch->body(g_launch->state);
    Fiber& f = *g_current;
    f.state = State::kDone;
    yield(f); // resumed at the next block's start
  }
}

std::size_t shared_bytes(const Launch& launch) {
  std::size_t bytes = launch.config.shared_bytes;
  for (const auto& variable : launch.shared) {
    bytes += variable.second;
  }
  return bytes;
}

// Runs warp `w`'s lanes until each has ended or waits at __syncthreads:
// a warp's shuffles complete among its own lanes, so one warp may run far
// ahead of the others, as on a GPU. False (with launch.failure set) where
// its lanes broke a rule.
bool run_warp(Launch& launch, unsigned w, unsigned threads, bool reverse,
              const uint3& block) {
  const unsigned first = w * 32;
  const unsigned last = first + 32 < threads ? first + 32 : threads;
  for (;;) {
    for (unsigned k = first; k < last; ++k) {
      Fiber& f = launch.fibers[reverse ? first + last - 1 - k : k];
      if (f.state != State::kReady) {
        continue;
      }
      resume(f);
      if (!launch.failure.empty()) {
        return false;
      }
    }
    // A full-mask shuffle waits for the lanes that have not ended (CUDA:
    // every non-exited thread the mask names must reach it); a lane that
    // waits at __syncthreads instead is a divergence a GPU leaves undefined.
    unsigned waiting = 0, at_barrier = 0;
    for (unsigned t = first; t < last; ++t) {
      waiting += launch.fibers[t].state == State::kAtShuffle ? 1 : 0;
      at_barrier += launch.fibers[t].state == State::kAtSyncthreads ? 1 : 0;
    }
    if (waiting == 0) {
      return true;
    }
    if (at_barrier > 0) {
      std::ostringstream why;
      why << "block " << describe(block) << ": " << waiting << " of warp " << w
          << "'s lanes wait at a shuffle whose mask names all 32, "
          << at_barrier << " at __syncthreads";
      launch.failure = why.str();
      return false;
    }
    for (unsigned t = first; t < last; ++t) {
      if (launch.fibers[t].state == State::kAtShuffle) {
        launch.fibers[t].state = State::kReady;
      }
    }
  }
}

// Makes `f` start at trampoline() on its stack when first resumed. Never
// inlined: getcontext returns twice, and no caller's variable should live
// in its frame.
__attribute__((noinline)) void prepare(Fiber& f) {
#if LAMP_EMU_ASAN
  // A stack left mid-frame by an earlier launch's fiber keeps its frames'
  // poisoned red zones.
  ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
#endif
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr; // a fiber ends by _longjmp, never returns
  makecontext(&f.context, trampoline, 0);
}

// Runs one block to its end, warp after warp between its barriers; false
// (with launch.failure set) where its threads broke a rule.
bool run_block(Launch& launch, const uint3& block, bool reverse) {
  const dim3& b = launch.config.block;
  const unsigned threads = b.x * b.y * b.z;
  const unsigned warps = (threads + 31) / 32;
  launch.shared_touched.clear();
  if (!launch.dynamic_shared.empty()) {
    std::memset(launch.dynamic_shared.data(), kGarbage,
                launch.dynamic_shared.size());
  }
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = launch.fibers[t];
    f.state = State::kReady;
    f.linear = t;
    f.indices.thread_idx = make_uint3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
    f.indices.block_idx = block;
    f.indices.block_dim = b;
    f.indices.grid_dim = launch.config.grid;
    if (f.started) {
      continue; // it waits at the end of its previous block
    }
    prepare(f);
  }
  for (;;) {
    for (unsigned k = 0; k < warps; ++k) {
      if (!run_warp(launch, reverse ? warps - 1 - k : k, threads, reverse,
                    block)) {
        return false;
      }
    }
    // Every thread has ended or waits at __syncthreads. A barrier that some
    // threads ended before, or that the others reach from different lines,
    // is undefined on a GPU (CUDA allows __syncthreads in conditional code
    // only where the whole block takes the branch): the launch fails.
    unsigned at_barrier = 0, ended = 0;
    const Fiber* site = nullptr;
    bool one_site = true;
    for (unsigned t = 0; t < threads; ++t) {
      const Fiber& f = launch.fibers[t];
      if (f.state == State::kAtSyncthreads) {
        one_site = one_site &&
                   (site == nullptr ||
                    (site->barrier_line == f.barrier_line &&
                     std::strcmp(site->barrier_file, f.barrier_file) == 0));
        site = &f;
        ++at_barrier;
      } else {
        ++ended;
      }
    }
    if (at_barrier > 0 && (ended > 0 || !one_site)) {
      std::ostringstream why;
      why << "block " << describe(block) << ": " << at_barrier
          << " threads wait at __syncthreads"
          << (one_site ? "" : " from different lines") << ", " << ended
          << " have ended (a barrier the whole block must reach)";
      launch.failure = why.str();
      return false;
    }
    for (unsigned t = 0; t < threads; ++t) {
      if (launch.fibers[t].state == State::kAtSyncthreads) {
        launch.fibers[t].state = State::kReady;
      }
    }
    if (at_barrier == 0) {
      return true;
    }
  }
}

// The launch's outcome: its message (empty for a clean one) until the next
// launch; its error until cudaGetLastError() reads it, as CUDA's runtime
// keeps an error through later calls that succeed.
void finish(cudaError_t error, const std::string& message) {
  if (error != cudaSuccess) {
    g_last_error = error;
  }
  g_last_message = message;
}

} // namespace

const Context& current() {
  return running("threadIdx").indices;
}

void sync_threads(const char* file, int line) {
  Fiber& f = running("__syncthreads");
  f.barrier_file = file;
  f.barrier_line = line;
  f.state = State::kAtSyncthreads;
  yield(f);
}

void sync_warp(unsigned mask) {
  Fiber& f = running("__shfl_xor_sync");
  if (mask != 0xffffffffu) {
    std::ostringstream why;
    why << "thread " << describe(f.indices.thread_idx) << " of block "
        << describe(f.indices.block_idx) << ": a shuffle mask of 0x" << std::hex
        << mask << " (the emulator takes whole warps)";
    fail(why.str());
  }
  f.state = State::kAtShuffle;
  yield(f);
}

void* exchange_slot(unsigned lane) {
  const Fiber& f = running("__shfl_xor_sync");
  return &g_launch->exchange[f.linear / 32 * 32 + lane % 32];
}

void check_source_lane(unsigned lane) {
  const Fiber& f = running("__shfl_xor_sync");
  const unsigned source = f.linear / 32 * 32 + lane % 32;
  if (source >= g_launch->fibers.size() ||
      g_launch->fibers[source].state == State::kDone) {
    std::ostringstream why;
    why << "thread " << describe(f.indices.thread_idx) << " of block "
        << describe(f.indices.block_idx) << ": a shuffle reads lane "
        << lane % 32 << ", which has ended or does not exist (undefined)";
    fail(why.str());
  }
}

unsigned lane_id() {
  return running("__shfl_xor_sync").linear % 32;
}

void shared_variable(const void* address, std::size_t bytes) {
  running("__shared__");
  g_launch->shared.emplace(address, bytes);
  if (g_launch->shared_touched.emplace(address, true).second) {
    std::memset(const_cast<void*>(address), kGarbage, bytes);
  }
}

void* dynamic_shared_memory() {
  running("extern __shared__");
  return g_launch->dynamic_shared.data();
}

void launch(const Config& config, std::size_t parameter_bytes,
            void (*body)(void*), void* state) {
  ++g_launches;
  const dim3& g = config.grid;
  const dim3& b = config.block;
  const unsigned long long threads =
      static_cast<unsigned long long>(b.x) * b.y * b.z;
  std::ostringstream why;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 ||
      g.x > 2147483647u) {
    why << "grid " << describe(g)
        << ": each size from 1 (2^31 - 1 for x, 65535 for y and z)";
  } else if (threads == 0 || threads > 1024 || b.z > 64) {
    why << "block " << describe(b) << ": 1 to 1024 threads (z at most 64)";
  } else if (config.shared_bytes > kSharedBytesPerBlock) {
    why << config.shared_bytes << " bytes of dynamic shared memory: at most "
        << kSharedBytesPerBlock << " without opting in to more";
  } else if (parameter_bytes > kParameterBytes) {
    why << parameter_bytes << " bytes of parameters: at most "
        << kParameterBytes;
  }
  if (!why.str().empty()) {
    finish(cudaErrorInvalidConfiguration, "launch refused: " + why.str());
    return;
  }
  if (g_launch != nullptr) {
    std::fprintf(stderr, "lamp_emu: a launch from inside a kernel\n");
    std::abort();
  }
  Launch launch;
  launch.config = config;
  launch.body = body;
  launch.state = state;
  launch.fibers.resize(static_cast<std::size_t>(threads));
  while (g_stacks.size() < launch.fibers.size()) {
    g_stacks.push_back(new_stack());
  }
  for (std::size_t t = 0; t < launch.fibers.size(); ++t) {
    launch.fibers[t].stack = g_stacks[t];
  }
  launch.exchange.resize((static_cast<std::size_t>(threads) + 31) / 32 * 32);
  launch.dynamic_shared.resize(config.shared_bytes);
  g_launch = &launch;
  unsigned long long index = 0;
  std::string failure;
  for (unsigned z = 0; z < g.z && failure.empty(); ++z) {
    for (unsigned y = 0; y < g.y && failure.empty(); ++y) {
      for (unsigned x = 0; x < g.x && failure.empty(); ++x, ++index) {
        if (!run_block(launch, make_uint3(x, y, z), index % 2 == 1)) {
          failure = launch.failure;
        } else if (shared_bytes(launch) > kSharedBytesPerBlock) {
          std::ostringstream too_much;
          too_much << shared_bytes(launch) << " bytes of shared memory ("
                   << config.shared_bytes << " dynamic): at most "
                   << kSharedBytesPerBlock << " without opting in to more";
          failure = "launch refused: " + too_much.str();
        }
      }
    }
  }
  g_launch = nullptr;
  if (failure.empty()) {
    finish(cudaSuccess, "");
  } else {
    finish(failure.rfind("launch refused", 0) == 0
               ? cudaErrorInvalidConfiguration
               : cudaErrorLaunchFailure,
           failure);
  }
}

std::string last_launch_message() {
  return g_last_message;
}

std::int64_t launches() {
  return g_launches;
}

} // namespace lamp_emu

extern "C" cudaError_t lamp_emulated_cuda_get_last_error() {
  const cudaError_t error = lamp_emu::g_last_error;
  lamp_emu::g_last_error = cudaSuccess;
  return error;
}

extern "C" cudaError_t lamp_emulated_cuda_peek_at_last_error() {
  return lamp_emu::g_last_error;
}
