#include "lamp/platform/address_space.h"

#include <c10/util/Exception.h>

#include <sys/resource.h>

#include <fstream>
#include <sstream>

namespace lamp {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

// VmSize from /proc/self/status, in bytes; 0 where unreadable.
int64_t mapped_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) {
      std::istringstream fields(line.substr(7));
      int64_t kib = 0;
      fields >> kib;
      return kib * kKiB;
    }
  }
  return 0;
}

} // namespace

AddressSpace address_space() {
  AddressSpace space;
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    space.limit = static_cast<int64_t>(limit.rlim_cur);
  }
  space.mapped = mapped_bytes();
  return space;
}

int64_t address_space_needed(int threads, int64_t tensor_bytes) {
  TORCH_CHECK(threads >= 1 && tensor_bytes >= 0,
              "lamp::address_space_needed: threads must be at least 1 and "
              "tensor_bytes not negative, not ",
              threads, " and ", tensor_bytes, ".");
  // The first thread's buffer is mapped by now: OpenBLAS takes it at load.
  return (threads - 1) * kAddressSpacePerThread + kAddressSpaceForTensors +
         tensor_bytes;
}

void check_address_space(const AddressSpace& space, int64_t needed,
                         const std::string& who) {
  if (space.limit < 0 || space.limit - space.mapped >= needed) {
    return;
  }
  // Rounded up to whole MiB, in ulimit -v's unit.
  const int64_t enough_kib =
      (space.mapped + needed + kMiB - 1) / kMiB * (kMiB / kKiB);
  TORCH_CHECK(
      false, "the address-space limit (ulimit -v) is ", space.limit / kKiB,
      " KiB (", space.limit / kMiB, " MiB) and this process already maps ",
      space.mapped / kMiB, " MiB; ", who, " needs about ", needed / kMiB,
      " MiB more (the BLAS's work buffer and stack of each further compute "
      "thread, and the step's tensors). Under the limit LibTorch's libraries "
      "hang or crash instead of failing, so ",
      who, " is not started: raise the limit to at least ", enough_kib,
      " KiB (ulimit -v ", enough_kib,
      ") or remove it (ulimit -v unlimited), or use fewer threads "
      "(OMP_NUM_THREADS).");
}

} // namespace lamp
