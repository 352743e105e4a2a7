#pragma once

// Which of a byte-level BPE's file formats a file is in, by its first bytes
// (internal): lamp::data::BytePairEncoding::load() reads by it, and
// lamp::data::Tokenizer::load() tells a BPE from a SentencePiece model.

#include <string>

namespace lamp {
namespace data {
namespace internal {

enum class BytePairFile {
  kNone,     // none of these (a SentencePiece model is binary)
  kJson,     // Hugging Face's tokenizer.json or vocab.json
  kTiktoken, // tiktoken's: a token's bytes in base64, a space, its id
  kMerges,   // Hugging Face's merges.txt ("#version" first)
};

// What the start of a file (`head`: its first 256 bytes suffice) is.
BytePairFile byte_pair_file_kind(const std::string& head);

} // namespace internal
} // namespace data
} // namespace lamp
