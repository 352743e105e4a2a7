#include "lamp/platform/out_of_memory.h"

#include <charconv>

#include "platform/memory.h"
#include "platform/number_text.h"

namespace lamp {

bool is_out_of_memory(const c10::Error& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) {
    return true;
  }
  // LibTorch's CPU allocator reports a failed allocation as a plain
  // c10::Error: "DefaultCPUAllocator: not enough memory: you tried to
  // allocate N bytes." (1.13), "... can't allocate memory: ..." (2.x).
  const std::string message = error.what_without_backtrace();
  return message.find("not enough memory") != std::string::npos ||
         message.find("can't allocate memory") != std::string::npos ||
         message.find("out of memory") != std::string::npos;
}

void throw_out_of_memory(const std::string& what, int64_t bytes,
                         const std::string& cause) {
  std::string size;
  if (bytes >= 0) {
    // std::to_chars, not printf: a host program's locale would print a
    // decimal comma.
    char text[64];
    const auto written =
        std::to_chars(text, text + sizeof(text),
                      static_cast<double>(bytes) / (1024.0 * 1024.0),
                      std::chars_format::fixed, 1);
    size = " (" + std::string(text, written.ptr) + " MiB)";
  }
  TORCH_CHECK(
      false, "lamp: out of memory while allocating ", what, size, ": ", cause,
      ". Use a smaller batch size or model, free memory held elsewhere, or run with more memory (a limit such as `ulimit -v` or a container's may be below the machine's memory).");
}

void check_fits_in_memory(uint64_t bytes, const c10::Device& device,
                          const std::string& what, const std::string& fix) {
  const uint64_t memory = device_memory_bytes(device);
  TORCH_CHECK(memory == 0 || bytes <= memory, "lamp: ", what,
              " needs at least ", detail::byte_count(bytes), ", more than the ",
              detail::byte_count(memory), " of memory of ", device, "; ", fix,
              ".");
}

} // namespace lamp
