// A libFuzzer target for lamp::data::escape_text (src/data/text.cpp), which
// turns a byte-level model's samples into text a terminal shows safely. For
// every input the escaped text must be well-formed UTF-8 free of control
// bytes other than newline and tab, and reading its escapes back must give
// the input, byte for byte. Built and run by scripts/fuzz.sh --target text.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "lamp/data/text.h"

namespace {

// "\\" -> '\', "\xNN" -> the byte NN; any other backslash is a defect.
std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '\\') {
      out += '\\';
      ++i;
      continue;
    }
    if (i + 3 >= text.size() || text[i + 1] != 'x') {
      std::abort();
    }
    const auto hex = [&](char c) -> int {
      if (c >= '0' && c <= '9') {
        return c - '0';
      }
      if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
      }
      std::abort(); // upper case only
    };
    out += static_cast<char>(hex(text[i + 2]) * 16 + hex(text[i + 3]));
    i += 3;
  }
  return out;
}

// Well-formed UTF-8 (Unicode's table 3-7) whose only control bytes are
// newline and tab, and no DEL.
bool safe_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
        return false;
      }
      ++i;
      continue;
    }
    uint32_t code = 0;
    size_t length = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2, code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3, code = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4, code = c & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) {
      return false;
    }
    for (size_t k = 1; k < length; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) {
        return false;
      }
      code = code << 6 | (b & 0x3F);
    }
    const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length] || code > 0x10FFFF ||
        (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const std::string text = lamp::data::escape_text(bytes);
  if (!safe_utf8(text) || unescape(text) != bytes) {
    std::abort();
  }
  return 0;
}
