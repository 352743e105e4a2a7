#include "lamp/distributed/environment.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace lamp {
namespace distributed {
namespace {

c10::optional<std::string> getenv_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return c10::nullopt;
  }
  return std::string(value);
}

int parse_int(const char* name, const std::string& text, int min_value) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  TORCH_CHECK(
      errno == 0 && end != text.c_str() && *end == '\0' && value >= min_value &&
          value <= 1 << 30,
      "lamp::distributed: environment variable ", name, "='", text,
      "' is not an integer >= ", min_value,
      ". Start the program with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself.");
  return static_cast<int>(value);
}

int env_int(const char* name, int fallback, int min_value) {
  const auto text = getenv_string(name);
  return text ? parse_int(name, *text, min_value) : fallback;
}

} // namespace

c10::optional<Environment> Environment::from_env() {
  const auto rank = getenv_string("RANK");
  const auto world = getenv_string("WORLD_SIZE");
  if (!rank && !world) {
    return c10::nullopt;
  }
  TORCH_CHECK(
      rank && world, "lamp::distributed: ", (rank ? "RANK" : "WORLD_SIZE"),
      " is set but ", (rank ? "WORLD_SIZE" : "RANK"),
      " is not. Start the program with torchrun, which sets both, or unset both for a single-process run.");
  Environment env;
  env.rank = parse_int("RANK", *rank, 0);
  env.world_size = parse_int("WORLD_SIZE", *world, 1);
  // Each rank holds a connection to rank 0's store: no rendezvous gathers
  // more than this, and a larger value is a mistyped variable.
  TORCH_CHECK(env.world_size <= Environment::kMaxWorldSize,
              "lamp::distributed: WORLD_SIZE=", env.world_size,
              " is more ranks than one rendezvous can gather (at most ",
              Environment::kMaxWorldSize,
              "); check the variable (torchrun sets it to nnodes x "
              "nproc_per_node).");
  TORCH_CHECK(env.rank < env.world_size, "lamp::distributed: RANK=", env.rank,
              " must be smaller than WORLD_SIZE=", env.world_size, ".");
  env.local_rank = env_int("LOCAL_RANK", env.rank, 0);
  const bool local_world_set = getenv_string("LOCAL_WORLD_SIZE").has_value();
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", env.world_size, 1);
  TORCH_CHECK(env.local_rank < env.local_world_size,
              "lamp::distributed: LOCAL_RANK=", env.local_rank,
              " must be smaller than ",
              (local_world_set ? "LOCAL_WORLD_SIZE=" : "WORLD_SIZE="),
              env.local_world_size,
              (local_world_set ? "" : " (LOCAL_WORLD_SIZE is not set)"),
              "; check the variables (torchrun sets LOCAL_RANK to 0 ... "
              "nproc_per_node - 1 and LOCAL_WORLD_SIZE to nproc_per_node).");
  if (env.world_size > 1) {
    const auto addr = getenv_string("MASTER_ADDR");
    const auto port = getenv_string("MASTER_PORT");
    TORCH_CHECK(
        addr && port, "lamp::distributed: WORLD_SIZE=", env.world_size,
        " but MASTER_ADDR or MASTER_PORT is not set; the ranks meet at MASTER_ADDR:MASTER_PORT (torchrun sets both).");
    env.master_addr = *addr;
    env.master_port = parse_int("MASTER_PORT", *port, 1);
    TORCH_CHECK(env.master_port <= 65535,
                "lamp::distributed: MASTER_PORT=", env.master_port,
                " is not a TCP port (1-65535).");
  }
  env.agent_store =
      getenv_string("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  env.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0);
  return env;
}

} // namespace distributed
} // namespace lamp
