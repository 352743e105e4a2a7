// c10d's Gloo backend (CPU collectives). c10d's ProcessGroupGloo.hpp includes
// Gloo's own headers, which PyPI's torch wheel does not ship: CMake
// (cmake/LampGloo.cmake) compiles this file with LAMP_WITH_GLOO=1 where it
// found them and with LAMP_WITH_GLOO=0 otherwise. This is the only place
// that tells the two builds apart.
#include "lamp/distributed/process_group.h"

#include "distributed/backend.h"

#ifndef LAMP_WITH_GLOO
#error "LAMP_WITH_GLOO must be defined to 0 or 1 (cmake/LampGloo.cmake does)"
#endif

#if LAMP_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <cstdlib>

namespace lamp {
namespace distributed {

bool gloo_available() {
  return LAMP_WITH_GLOO != 0;
}

} // namespace distributed

namespace detail {

#if LAMP_WITH_GLOO
c10::intrusive_ptr<C10dBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  options->devices.push_back(
      interface != nullptr && *interface != '\0'
          ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
          : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size,
                                                     options);
}
#else
c10::intrusive_ptr<C10dBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>&, int, int,
    std::chrono::milliseconds) {
  TORCH_CHECK(false, "lamp::distributed: ", kNoGlooMessage);
}
#endif

} // namespace detail
} // namespace lamp
