#include "data/gpt2_split.h"

#include <c10/util/Exception.h>

#include <cstdint>

#if LAMP_WITH_ICU
#include <unicode/uchar.h>
#include <unicode/utf8.h>
#endif

namespace lamp {
namespace data {
namespace detail {

#if LAMP_WITH_ICU

namespace {

// The pattern's three kinds of character.
enum class Kind { kLetter, kNumber, kSpace, kOther };

struct Character {
  Kind kind;
  size_t bytes; // its length in the text
};

Kind kind_of(UChar32 c) {
  if (u_isUWhiteSpace(c)) {
    return Kind::kSpace;
  }
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return Kind::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return Kind::kNumber;
    default:
      return Kind::kOther;
  }
}

// The character at byte `i` (i < size): ASCII without ICU's call, a byte
// that begins no well-formed character as one of kOther.
Character character_at(const std::string& text, size_t i) {
  const auto byte = static_cast<unsigned char>(text[i]);
  if (byte < 0x80) {
    const char c = static_cast<char>(byte);
    if (c == ' ' || (c >= '\t' && c <= '\r')) {
      return {Kind::kSpace, 1};
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return {Kind::kLetter, 1};
    }
    if (c >= '0' && c <= '9') {
      return {Kind::kNumber, 1};
    }
    return {Kind::kOther, 1};
  }
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  auto at = static_cast<int32_t>(i);
  UChar32 c = 0;
  U8_NEXT(s, at, length, c);
  const Character stray{Kind::kOther, 1}; // a byte that begins none
  return c < 0 ? stray : Character{kind_of(c), static_cast<size_t>(at) - i};
}

// The end of the run of characters of `kind` from `i`.
size_t run_end(const std::string& text, size_t i, Kind kind) {
  while (i < text.size()) {
    const auto c = character_at(text, i);
    if (c.kind != kind) {
      break;
    }
    i += c.bytes;
  }
  return i;
}

// Where the piece from `p` ends: the pattern's alternatives in order, the
// first that matches.
size_t piece_end(const std::string& text, size_t p) {
  const size_t n = text.size();
  // 's 't 'm 'd, 're 've 'll.
  if (text[p] == '\'' && p + 1 < n) {
    const char a = text[p + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') {
      return p + 2;
    }
    if (p + 2 < n) {
      const char b = text[p + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
          (a == 'l' && b == 'l')) {
        return p + 3;
      }
    }
  }
  const auto first = character_at(text, p);
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a space may lead a run of
  // one kind; a space itself is none of the three.
  if (first.kind != Kind::kSpace) {
    return run_end(text, p, first.kind);
  }
  if (text[p] == ' ' && p + 1 < n) {
    const auto next = character_at(text, p + 1);
    if (next.kind != Kind::kSpace) {
      return run_end(text, p + 1, next.kind);
    }
  }
  // '\s+(?!\S)': the run of white space, but for its last character where
  // something else follows (that character leads the next piece), when
  // the run has more than one; else '\s+' (one character, or all of them
  // at the text's end).
  size_t last = p;
  size_t end = p;
  while (end < n) {
    const auto c = character_at(text, end);
    if (c.kind != Kind::kSpace) {
      break;
    }
    last = end;
    end += c.bytes;
  }
  if (end < n && last > p) {
    return last;
  }
  return end;
}

} // namespace

bool gpt2_split_available() {
  return true;
}

void gpt2_split(const std::string& text,
                const std::function<void(size_t, size_t)>& piece) {
  size_t p = 0;
  while (p < text.size()) {
    const size_t end = piece_end(text, p);
    TORCH_INTERNAL_ASSERT(end > p, "gpt2_split: an empty piece at byte ", p);
    piece(p, end);
    p = end;
  }
}

#else

bool gpt2_split_available() {
  return false;
}

void gpt2_split(const std::string& text,
                const std::function<void(size_t, size_t)>& piece) {
  (void)piece;
  TORCH_CHECK(false,
              "lamp::data::BytePairEncoding::encode: this lamp was "
              "built without ICU, whose character classes GPT-2's split of "
              "a text (of ",
              text.size(),
              " bytes) needs; install libicu-dev "
              "(apt-get install libicu-dev) and rebuild lamp (CMake's "
              "LAMP_WITH_ICU finds it). Decoding needs no ICU.");
}

#endif

} // namespace detail
} // namespace data
} // namespace lamp
