#pragma once

// The splits of a text into the pieces a byte-level BPE merges within
// (internal; lamp::data::BytePairEncoding::encode()).

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "lamp/data/byte_pair.h"

namespace lamp {
namespace data {
namespace detail {

// Whether this lamp was built with ICU's character classes, which the
// splits need.
bool byte_pair_split_available();

// Calls piece(begin, end) for each piece of `text`, in order, the byte
// ranges covering the text: the matches of `split`'s pattern as tiktoken's
// regex finds them (the first alternative that matches, greedy), with
// \p{L}, \p{Lu}, \p{Ll}, \p{M}, \p{N}, ... Unicode's general categories and
// \s its White_Space property, as ICU classes them:
// - kGpt2 (r50k_base, p50k_base):
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
//     |\s+(?!\S)|\s+
// - kCl100k (tiktoken 0.8 and later):
//     '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+
//     | ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s
// - kLlama3: kCl100k without \s++$ (the same pieces, but for white space
//   that ends the text and holds a line break: there the pieces end after
//   its last line break, and the rest is a piece of its own);
// - kO200k:
//     [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*
//       [\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//     |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+
//       [\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//     |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Case-blind contractions take what Unicode's simple case folding does
// (S, s and U+017F for s). A byte that does not begin a well-formed UTF-8
// character (Python's text can hold none) is a character of its own, of
// none of the classes (punctuation's kind). Throws when
// byte_pair_split_available() is false; `split` is never kAuto.
void byte_pair_split(std::string_view text, BytePairSplit split,
                     const std::function<void(size_t, size_t)>& piece);

// Whether every split starts a piece at text[i] whatever follows, with the
// pieces of text[0, i) those of the whole text before i, so that encoding
// text[0, i) and text[i, n) apart gives the whole's ids. Three places are:
// - After a line break: text[i - 1] is '\n' after a character that is not
//   white space, and text[i] begins a character that is neither white
//   space nor '/'. No pattern lets a line break lead a piece of letters,
//   digits or punctuation, so the break ends the piece it is in; that
//   piece is the break alone (no white space before it) or, for
//   cl100k_base's, Llama 3's and o200k_base's punctuation, the punctuation
//   before it with the line breaks (and, for o200k_base's, slashes) after
//   it: text[i] is neither; and at the text's end a lone break is one
//   piece as before a character that is not white space.
// - Before a space between two letters ("word| word"): the first word's
//   piece ends at the space, which no pattern of letters takes after them,
//   and the space leads the next word's piece in every split (" ?\p{L}+",
//   "[^\r\n\p{L}\p{N}]?\p{L}+").
// - Before a '\r' after a letter or a digit: the word's or number's piece
//   ends there, and the break begins the next. (After punctuation, three
//   splits take the breaks into its piece: not there.)
// So a text of Windows' line breaks ("\r\n", where a cut after the break
// would change GPT-2's pieces of the white space) or of one long line is
// cut as often as any. False where lamp was built without ICU.
bool byte_pair_cut_is_safe(std::string_view text, size_t i);

} // namespace detail
} // namespace data
} // namespace lamp
