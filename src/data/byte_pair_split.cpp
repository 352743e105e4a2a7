#include "data/byte_pair_split.h"

#include <c10/util/Exception.h>

#include <algorithm>
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

// The classes the patterns name: cased letters (\p{Lu}\p{Lt} and \p{Ll}),
// the other letters (\p{Lm}\p{Lo}), marks (\p{M}, no letters), numbers
// (\p{N}), white space (\s) and the rest.
enum class Class {
  kUpper,
  kLower,
  kOtherLetter,
  kMark,
  kNumber,
  kSpace,
  kOther
};

struct Character {
  Class cls;
  size_t bytes; // its length in the text
};

bool is_letter(Class c) {
  return c == Class::kUpper || c == Class::kLower || c == Class::kOtherLetter;
}

// [^\s\p{L}\p{N}]: punctuation, symbols, marks, controls.
bool is_other(Class c) {
  return !is_letter(c) && c != Class::kNumber && c != Class::kSpace;
}

// o200k_base's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// [\p{Ll}\p{Lm}\p{Lo}\p{M}].
bool is_upper_word(Class c) {
  return c == Class::kUpper || c == Class::kOtherLetter || c == Class::kMark;
}
bool is_lower_word(Class c) {
  return c == Class::kLower || c == Class::kOtherLetter || c == Class::kMark;
}

Class class_of(UChar32 c) {
  if (u_isUWhiteSpace(c)) {
    return Class::kSpace;
  }
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER:
      return Class::kUpper;
    case U_LOWERCASE_LETTER:
      return Class::kLower;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return Class::kOtherLetter;
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      return Class::kMark;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return Class::kNumber;
    default:
      return Class::kOther;
  }
}

// The character at byte `i` (i < size): ASCII without ICU's call, a byte
// that begins no well-formed character as one of kOther.
Character character_at(std::string_view text, size_t i) {
  const auto byte = static_cast<unsigned char>(text[i]);
  if (byte < 0x80) {
    const char c = static_cast<char>(byte);
    if (c == ' ' || (c >= '\t' && c <= '\r')) {
      return {Class::kSpace, 1};
    }
    if (c >= 'a' && c <= 'z') {
      return {Class::kLower, 1};
    }
    if (c >= 'A' && c <= 'Z') {
      return {Class::kUpper, 1};
    }
    if (c >= '0' && c <= '9') {
      return {Class::kNumber, 1};
    }
    return {Class::kOther, 1};
  }
  // ICU indexes with int32_t: from the character's own first byte, at most
  // 4 bytes on, so that a text past 2 GiB is read as any other.
  const auto* s = reinterpret_cast<const uint8_t*>(text.data()) + i;
  const auto length =
      static_cast<int32_t>(std::min<size_t>(4, text.size() - i));
  int32_t at = 0;
  UChar32 c = 0;
  U8_NEXT(s, at, length, c);
  const Character stray{Class::kOther, 1}; // a byte that begins none
  return c < 0 ? stray : Character{class_of(c), static_cast<size_t>(at)};
}

// The class of the character that ends at text[end - 1] (end > 0): from
// its last byte back to the byte that begins it. Where that does not end
// at text[end - 1], the byte there ends no well-formed character: the
// split takes it as one of its own, of punctuation's kind (kOther).
Class class_ending_at(std::string_view text, size_t end) {
  size_t start = end - 1;
  for (int k = 0; k < 3 && start > 0 &&
                  (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80;
       ++k) {
    --start;
  }
  const auto c = character_at(text, start);
  return start + c.bytes == end ? c.cls : Class::kOther;
}

bool is_line_break(std::string_view text, size_t i) {
  return text[i] == '\r' || text[i] == '\n';
}

// The end of the run of characters from `i` that `in` takes.
template <typename In>
size_t run_end(std::string_view text, size_t i, In in) {
  while (i < text.size()) {
    const auto c = character_at(text, i);
    if (!in(c.cls)) {
      break;
    }
    i += c.bytes;
  }
  return i;
}

// The run of white space from `p`: where it ends, where its last character
// begins, and where its last line break ends (`p` if it holds none).
struct SpaceRun {
  size_t end;
  size_t last;
  size_t after_break;
};

SpaceRun space_run(std::string_view text, size_t p) {
  SpaceRun run{p, p, p};
  while (run.end < text.size()) {
    const auto c = character_at(text, run.end);
    if (c.cls != Class::kSpace) {
      break;
    }
    run.last = run.end;
    run.end += c.bytes;
    if (is_line_break(text, run.last)) {
      run.after_break = run.end;
    }
  }
  return run;
}

// '\s+(?!\S)|\s+': the run of white space, but for its last character where
// something else follows (that character leads the next piece), when the
// run has more than one; else the run (one character, or all of them at
// the text's end).
size_t spaces_end(std::string_view text, const SpaceRun& run, size_t p) {
  return run.end < text.size() && run.last > p ? run.last : run.end;
}

// The contractions 's 't 'm 'd, 're 've 'll: as they are cased (GPT-2's),
// or, `any_case`, case-blind ((?i:...)), where Unicode's simple case
// folding adds U+017F (long s, UTF-8 C5 BF) to s and S.
size_t contraction_end(std::string_view text, size_t p, bool any_case) {
  const size_t n = text.size();
  if (text[p] != '\'' || p + 1 >= n) {
    return p;
  }
  const auto fold = [any_case](char c) {
    return any_case && c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a')
                                            : c;
  };
  const char a = fold(text[p + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') {
    return p + 2;
  }
  if (any_case && text[p + 1] == '\xC5' && p + 2 < n && text[p + 2] == '\xBF') {
    return p + 3;
  }
  if (p + 2 < n) {
    const char b = fold(text[p + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
        (a == 'l' && b == 'l')) {
      return p + 3;
    }
  }
  return p;
}

// GPT-2's kinds: letters, numbers, white space, and the rest.
Class gpt2_kind(Class c) {
  return is_letter(c) ? Class::kLower : (is_other(c) ? Class::kOther : c);
}

size_t gpt2_piece_end(std::string_view text, size_t p) {
  const size_t contraction = contraction_end(text, p, false);
  if (contraction > p) {
    return contraction;
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a space may lead a run of
  // one kind; a space itself is none of the three.
  const auto run_of = [&text](size_t from, Class c) {
    const Class kind = gpt2_kind(c);
    return run_end(text, from,
                   [kind](Class d) { return gpt2_kind(d) == kind; });
  };
  const auto first = character_at(text, p);
  if (first.cls != Class::kSpace) {
    return run_of(p, first.cls);
  }
  if (text[p] == ' ' && p + 1 < text.size()) {
    const auto next = character_at(text, p + 1);
    if (next.cls != Class::kSpace) {
      return run_of(p + 1, next.cls);
    }
  }
  return spaces_end(text, space_run(text, p), p);
}

// ' ?[^\s\p{L}\p{N}]+' then the line breaks after it (and, for o200k_base,
// slashes), or `p` where it does not match.
size_t punctuation_end(std::string_view text, size_t p, bool slashes) {
  const size_t n = text.size();
  size_t q = p;
  if (text[p] == ' ' && p + 1 < n && is_other(character_at(text, p + 1).cls)) {
    q = p + 1;
  }
  if (!is_other(character_at(text, q).cls)) {
    return p;
  }
  q = run_end(text, q, is_other);
  while (q < n && (is_line_break(text, q) || (slashes && text[q] == '/'))) {
    ++q;
  }
  return q;
}

// \p{N}{1,3}
size_t digits_end(std::string_view text, size_t p) {
  size_t q = p;
  for (int i = 0; i < 3 && q < text.size(); ++i) {
    const auto c = character_at(text, q);
    if (c.cls != Class::kNumber) {
      break;
    }
    q += c.bytes;
  }
  return q;
}

// What follows the words in cl100k_base's and o200k_base's patterns:
// '\p{N}{1,3}', then ' ?[^\s\p{L}\p{N}]+' with the line breaks after it
// (and, with `slashes`, slashes), then white space: '\s*[\r\n]' (and
// '\s*[\r\n]+'), the run of white space to its last line break, else
// '\s+(?!\S)|\s+'. With `whole_at_end`, '\s++$' comes first: a run that
// ends the text is one piece.
size_t after_words_end(std::string_view text, size_t p, Class first,
                       bool slashes, bool whole_at_end) {
  if (first == Class::kNumber) {
    return digits_end(text, p);
  }
  const size_t punctuation = punctuation_end(text, p, slashes);
  if (punctuation > p) {
    return punctuation;
  }
  const auto run = space_run(text, p);
  if (whole_at_end && run.end == text.size()) {
    return run.end;
  }
  if (run.after_break > p) {
    return run.after_break;
  }
  return spaces_end(text, run, p);
}

// '[^\r\n\p{L}\p{N}]': the character that may lead a word (a space,
// punctuation, a mark).
bool may_lead_word(std::string_view text, size_t p, Class c) {
  return !is_letter(c) && c != Class::kNumber && !is_line_break(text, p);
}

size_t cl100k_piece_end(std::string_view text, size_t p, bool whole_at_end) {
  const size_t contraction = contraction_end(text, p, true);
  if (contraction > p) {
    return contraction;
  }
  const auto first = character_at(text, p);
  // '[^\r\n\p{L}\p{N}]?+\p{L}++': letters, maybe led by one character.
  if (is_letter(first.cls)) {
    return run_end(text, p, is_letter);
  }
  const size_t next = p + first.bytes;
  if (may_lead_word(text, p, first.cls) && next < text.size() &&
      is_letter(character_at(text, next).cls)) {
    return run_end(text, next, is_letter);
  }
  return after_words_end(text, p, first.cls, false, whole_at_end);
}

// o200k_base's words from `q`, or `q` where none matches: `lower_last`, the
// first alternative, [upper]*[lower]+; else [upper]+[lower]*; then a
// contraction. [upper] and [lower] share \p{Lm}\p{Lo}\p{M}, so the first
// gives back upper characters until a lower one follows: the run of upper
// ones, if a lower one follows it, else to the last of them that is also
// lower.
size_t o200k_word_end(std::string_view text, size_t q, bool lower_last) {
  const size_t n = text.size();
  size_t upper_end = q;
  size_t last_lower = n; // the last upper character that is lower too
  while (upper_end < n) {
    const auto c = character_at(text, upper_end);
    if (!is_upper_word(c.cls)) {
      break;
    }
    if (is_lower_word(c.cls)) {
      last_lower = upper_end;
    }
    upper_end += c.bytes;
  }
  size_t end = upper_end;
  if (lower_last) {
    const bool lower_follows =
        upper_end < n && is_lower_word(character_at(text, upper_end).cls);
    if (!lower_follows && last_lower == n) {
      return q;
    }
    end = run_end(text, lower_follows ? upper_end : last_lower, is_lower_word);
  } else {
    if (upper_end == q) {
      return q;
    }
    end = run_end(text, upper_end, is_lower_word);
  }
  return end < n ? contraction_end(text, end, true) : end;
}

size_t o200k_piece_end(std::string_view text, size_t p) {
  const auto first = character_at(text, p);
  const bool may_lead = may_lead_word(text, p, first.cls);
  for (const bool lower_last : {true, false}) {
    if (may_lead && p + first.bytes < text.size()) {
      const size_t q = p + first.bytes;
      const size_t end = o200k_word_end(text, q, lower_last);
      if (end > q) {
        return end;
      }
    }
    const size_t end = o200k_word_end(text, p, lower_last);
    if (end > p) {
      return end;
    }
  }
  return after_words_end(text, p, first.cls, true, false);
}

} // namespace

bool byte_pair_split_available() {
  return true;
}

bool byte_pair_cut_is_safe(std::string_view text, size_t i) {
  if (i == 0 || i >= text.size()) {
    return false;
  }
  if (text[i] == ' ') {
    return i + 1 < text.size() && is_letter(character_at(text, i + 1).cls) &&
           is_letter(class_ending_at(text, i));
  }
  if (text[i] == '\r') {
    const auto before = class_ending_at(text, i);
    return is_letter(before) || before == Class::kNumber;
  }
  return i >= 2 && text[i - 1] == '\n' && text[i] != '/' &&
         character_at(text, i).cls != Class::kSpace &&
         class_ending_at(text, i - 1) != Class::kSpace;
}

void byte_pair_split(std::string_view text, BytePairSplit split,
                     const std::function<void(size_t, size_t)>& piece) {
  TORCH_INTERNAL_ASSERT(split != BytePairSplit::kAuto,
                        "byte_pair_split: the split is not resolved");
  size_t p = 0;
  while (p < text.size()) {
    size_t end = p;
    switch (split) {
      case BytePairSplit::kCl100k:
        end = cl100k_piece_end(text, p, true);
        break;
      case BytePairSplit::kLlama3:
        end = cl100k_piece_end(text, p, false);
        break;
      case BytePairSplit::kO200k:
        end = o200k_piece_end(text, p);
        break;
      default:
        end = gpt2_piece_end(text, p);
        break;
    }
    TORCH_INTERNAL_ASSERT(end > p, "byte_pair_split: an empty piece at byte ",
                          p);
    piece(p, end);
    p = end;
  }
}

#else

bool byte_pair_split_available() {
  return false;
}

bool byte_pair_cut_is_safe(std::string_view text, size_t i) {
  (void)text;
  (void)i;
  return false;
}

void byte_pair_split(std::string_view text, BytePairSplit split,
                     const std::function<void(size_t, size_t)>& piece) {
  (void)split;
  (void)piece;
  TORCH_CHECK(false,
              "lamp::data::BytePairEncoding::encode: this lamp was "
              "built without ICU, whose character classes a byte-level "
              "BPE's split of a text (of ",
              text.size(),
              " bytes) needs; install libicu-dev "
              "(apt-get install libicu-dev) and rebuild lamp (CMake's "
              "LAMP_WITH_ICU finds it). Decoding needs no ICU.");
}

#endif

} // namespace detail
} // namespace data
} // namespace lamp
