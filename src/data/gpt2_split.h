#pragma once

// GPT-2's split of a text into the pieces its byte-pair encoding merges
// within (internal; lamp::data::BytePairEncoding::encode()).

#include <cstddef>
#include <functional>
#include <string>

namespace lamp {
namespace data {
namespace detail {

// Whether this lamp was built with ICU's character classes, which the split
// needs.
bool gpt2_split_available();

// Calls piece(begin, end) for each piece of `text`, in order, the byte
// ranges covering the text: the matches of GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as tiktoken's regex finds them (tiktoken's r50k pattern, the same split),
// with \p{L} and \p{N} Unicode's general categories L and N and \s its
// White_Space property. A byte that does not begin a well-formed UTF-8
// character (Python's text can hold none) is a character of its own, of
// the third kind ([^\s\p{L}\p{N}]). Throws when gpt2_split_available() is
// false.
void gpt2_split(const std::string& text,
                const std::function<void(size_t, size_t)>& piece);

} // namespace detail
} // namespace data
} // namespace lamp
