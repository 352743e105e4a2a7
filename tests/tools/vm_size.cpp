// Prints the address space (VmSize, KiB) a program linked like the bundled
// programs (lamp and LibTorch) maps once main() runs: the base from which
// tests/faults/address_space.sh sets its `ulimit -v`.
#include <cstdio>

#include "lamp/platform/address_space.h"

int main() {
  const auto space = lamp::address_space();
  if (space.mapped <= 0) {
    std::fprintf(stderr, "lamp_vm_size: /proc/self/status has no VmSize\n");
    return 1;
  }
  std::printf("%lld\n", static_cast<long long>(space.mapped / 1024));
  return 0;
}
