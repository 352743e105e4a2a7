#include "lamp/data/text.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/files.h"
#include "data/text_reader.h"
#include "lamp/platform/out_of_memory.h"

namespace lamp {
namespace data {
namespace {

using internal::quoted;

constexpr const char* kDebianFortunes = "/usr/share/games/fortunes";
// What read_text_bytes() reads of a file at a time (decompressed).
constexpr size_t kReadBytes = size_t{16} << 20;

} // namespace

torch::Tensor read_text_bytes(const std::string& path) {
  const char* caller = "lamp::data::read_text_bytes";
  const auto files = internal::text_input_files(path, caller);
  std::string all;
  for (const auto& file : files) {
    internal::TextReader reader(file, caller);
    const size_t old = all.size();
    const bool plain = reader.compression() == internal::Compression::kNone;
    if (plain) {
      // One read of the size measured, as the file is, and a byte to see
      // its end.
      const auto size = internal::regular_file_size(file, caller);
      lamp::with_memory_context(
          "the contents of " + quoted(file), static_cast<int64_t>(size),
          [&] { all.reserve(old + static_cast<size_t>(size) + 1); });
    }
    // A plain file's reads stay within the room reserved: a read past it
    // would double the string (twice the file in memory, and a copy).
    while (reader.read(all,
                       plain ? std::max<size_t>(all.capacity() - all.size(), 1)
                             : kReadBytes) > 0) {
    }
    internal::TextCheck check(file, caller);
    check.add(reinterpret_cast<const uint8_t*>(all.data()) + old,
              all.size() - old);
    check.finish();
  }
  TORCH_CHECK(!all.empty(), caller, ": ", quoted(path),
              " is empty; give a text file with some text in it.");
  return torch::from_blob(all.data(), {static_cast<int64_t>(all.size())},
                          torch::kUInt8)
      .clone();
}

Dataset text_windows(const torch::Tensor& tokens, int64_t context) {
  internal::check_context(context, "lamp::data::text_windows");
  TORCH_CHECK(tokens.dim() == 1 && !tokens.is_floating_point() &&
                  !tokens.is_complex() && tokens.scalar_type() != torch::kBool,
              "lamp::data::text_windows: tokens must be integers [n] (uint8 "
              "bytes, or token ids of token_dtype()), got ",
              tokens.scalar_type(), " ", tokens.sizes(), ".");
  const int64_t n = tokens.size(0);
  TORCH_CHECK(n >= context + 1, "lamp::data::text_windows: ", n,
              " tokens make no window of context ", context, " (it needs ",
              context + 1, ": the window and the next token of its last).");
  const int64_t windows = (n - 1) / context;
  const auto cpu = tokens.cpu().contiguous();
  // One copy of the tokens the windows span, so that they do not hold the
  // whole text alive; the inputs and the targets are two views of it, as
  // read_token_files()'s are of the mapping (the loader copies the span
  // once, and can draw windows at any offset of it).
  const auto span = cpu.slice(0, 0, windows * context + 1).clone();
  auto inputs = span.slice(0, 0, windows * context).view({windows, context});
  auto targets =
      span.slice(0, 1, windows * context + 1).view({windows, context});
  return {std::move(inputs), std::move(targets)};
}

TextData read_text_windows(const std::string& path, int64_t context,
                           double validation_fraction) {
  const char* caller = "lamp::data::read_text_windows";
  internal::check_context(context, caller);
  TORCH_CHECK(validation_fraction > 0 && validation_fraction < 1, caller,
              ": validation_fraction must be in (0, 1), got ",
              validation_fraction, ".");
  const auto bytes = read_text_bytes(path);
  TextData data;
  data.bytes = bytes.size(0);
  data.train_bytes = static_cast<int64_t>(std::floor(
      (1.0 - validation_fraction) * static_cast<double>(data.bytes)));
  data.validation_bytes = data.bytes - data.train_bytes;
  data.train_tokens = data.train_bytes;
  data.validation_tokens = data.validation_bytes;
  const int64_t smallest = std::min(data.train_bytes, data.validation_bytes);
  if (smallest < context + 1) {
    // In double: a fraction within 1e-16 of 0 or 1 needs more bytes than
    // int64 counts.
    const double needed =
        std::ceil(static_cast<double>(context + 1) /
                  std::min(validation_fraction, 1.0 - validation_fraction));
    TORCH_CHECK(false, caller, ": ", quoted(path), " holds ", data.bytes,
                " bytes: ", data.train_bytes, " for training and ",
                data.validation_bytes,
                " for validation, but each part needs at least context + 1 = ",
                context + 1, " bytes; ",
                needed < 9e15
                    ? "give a text of at least " +
                          std::to_string(static_cast<int64_t>(needed)) +
                          " bytes, or a shorter context."
                    : std::string("give a validation_fraction further from 0 "
                                  "and 1."));
  }
  data.train = text_windows(bytes.slice(0, 0, data.train_bytes), context);
  data.validation = text_windows(bytes.slice(0, data.train_bytes), context);
  return data;
}

std::string default_text_path() {
  return internal::directory_exists(kDebianFortunes) ? kDebianFortunes : "";
}

namespace {

// The length of the well-formed UTF-8 sequence at `text[i]` of at least two
// bytes (Unicode's table 3-7), or 0.
size_t utf8_sequence(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) {
    return static_cast<unsigned char>(text[k]);
  };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char lo = 0x80, hi = 0xBF; // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    lo = lead == 0xE0 ? 0xA0 : 0x80; // no overlong forms
    hi = lead == 0xED ? 0x9F : 0xBF; // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    lo = lead == 0xF0 ? 0x90 : 0x80;
    hi = lead == 0xF4 ? 0x8F : 0xBF; // at most U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) {
    return 0;
  }
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) {
      return 0;
    }
  }
  return length;
}

} // namespace

std::string escape_text(const std::string& bytes) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\\') {
      out += "\\\\";
      ++i;
    } else if ((c >= 0x20 && c < 0x7F) || c == '\n' || c == '\t') {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_sequence(bytes, i) : 0) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xF];
      ++i;
    }
  }
  return out;
}

} // namespace data
} // namespace lamp
