#pragma once

// The check that a tokenizer keeps a text as it is (internal): shared by
// tokenized_text_windows() and write_token_files().

#include <string>

#include "lamp/data/tokenizer.h"

namespace lamp {
namespace data {
namespace internal {

// Warns where `tokenizer` does not give back `text`'s first 64 KiB (its
// first lines; `text` read from `path`): a model that normalizes
// (spm_train's default, nmt_nfkc, folds newlines and runs of spaces into
// one space) or has no byte fallback changes what the samples can show, and
// the model learns the changed text.
void warn_unless_round_trip(const Tokenizer& tokenizer, const std::string& text,
                            const std::string& path);

} // namespace internal
} // namespace data
} // namespace lamp
