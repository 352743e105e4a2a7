#include "lamp/data/tokenizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "data/byte_pair_format.h"
#include "data/files.h"
#include "data/round_trip.h"
#include "lamp/data/datasets.h"

namespace lamp {
namespace data {
namespace {

using internal::quoted;

// The round trip checked on the text's first lines (up to this many bytes):
// enough to meet newlines, runs of spaces and the text's own characters.
constexpr size_t kRoundTripBytes = 65536;

// `text` escaped as escape_text() does, with newlines and tabs shown as
// \n and \t too, for a one-line message.
std::string visible(const std::string& text) {
  std::string out;
  for (const char c : escape_text(text)) {
    out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : std::string(1, c);
  }
  return out;
}

} // namespace

namespace internal {

void warn_unless_round_trip(const Tokenizer& tokenizer, const std::string& text,
                            const std::string& path) {
  std::string lines = text.substr(0, kRoundTripBytes);
  if (lines.size() < text.size()) {
    const size_t newline = lines.rfind('\n');
    if (newline != std::string::npos) {
      lines.resize(newline + 1);
    }
  }
  const auto back = tokenizer.decode(tokenizer.encode(lines));
  if (back == lines) {
    return;
  }
  size_t k = 0;
  while (k < back.size() && k < lines.size() && back[k] == lines[k]) {
    ++k;
  }
  TORCH_WARN(quoted(tokenizer.origin()), " does not give the text of ",
             quoted(path), " back as it is: from byte ", k, ", ",
             quoted(visible(lines.substr(k, 16))), " comes back as ",
             quoted(visible(back.substr(k, 16))),
             ". The model learns, and the samples show, the text as the "
             "tokenizer changes it; a tokenizer trained without "
             "normalization and with byte fallback (train_sentencepiece()'s "
             "defaults, and docs/gpt.md's spm_train command) keeps it, as a "
             "byte-level BPE (GPT-2's) does.");
}

} // namespace internal

Tokenizer::Tokenizer(SentencePiece model) : sentencepiece_(std::move(model)) {}

Tokenizer::Tokenizer(BytePairEncoding model) : byte_pair_(std::move(model)) {}

Tokenizer Tokenizer::load(const std::string& path) {
  if (internal::directory_exists(path)) {
    return BytePairEncoding::load(path);
  }
  // A missing file of no known kind: name every kind (a `.model` file's
  // absence SentencePiece::load names).
  const bool model_file =
      path.size() >= 6 && path.compare(path.size() - 6, 6, ".model") == 0;
  TORCH_CHECK(
      model_file || internal::path_kind(path) != internal::PathKind::kMissing,
      "lamp::data::Tokenizer::load: ", quoted(path),
      " does not exist; give a tokenizer: a tiktoken file, a Hugging "
      "Face tokenizer.json (or vocab.json with merges.txt, or their "
      "folder), or a SentencePiece .model file.");
  // A BPE's files are text (JSON, tiktoken's lines, or a merges.txt given
  // for its vocab.json, whose mistake BytePairEncoding names); a
  // SentencePiece model is binary.
  std::ifstream file(path, std::ios::binary);
  std::string head(256, '\0');
  file.read(&head[0], static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(file.gcount(), 0)));
  if (internal::byte_pair_file_kind(head) != internal::BytePairFile::kNone) {
    return BytePairEncoding::load(path);
  }
  return SentencePiece::load(path);
}

int64_t Tokenizer::vocab_size() const {
  return byte_pair_.empty() ? sentencepiece_.vocab_size()
                            : byte_pair_.vocab_size();
}

const std::string& Tokenizer::origin() const {
  return byte_pair_.empty() ? sentencepiece_.origin() : byte_pair_.origin();
}

std::string Tokenizer::describe() const {
  return byte_pair_.empty() ? sentencepiece_.describe() : byte_pair_.describe();
}

torch::Tensor Tokenizer::encode(const std::string& text) const {
  return byte_pair_.empty() ? sentencepiece_.encode(text)
                            : byte_pair_.encode(text);
}

int64_t Tokenizer::end_of_text_id() const {
  return byte_pair_.empty() ? sentencepiece_.end_of_text_id()
                            : byte_pair_.end_of_text_id();
}

std::string Tokenizer::decode(const torch::Tensor& ids) const {
  return byte_pair_.empty() ? sentencepiece_.decode(ids)
                            : byte_pair_.decode(ids);
}

TextData tokenized_text_windows(const torch::Tensor& bytes,
                                const std::string& path,
                                const Tokenizer& tokenizer, int64_t context,
                                double validation_fraction) {
  const char* caller = "lamp::data::tokenized_text_windows";
  internal::check_context(context, caller);
  TORCH_CHECK(!tokenizer.empty(), caller, ": the tokenizer holds no model.");
  TextData data;
  data.bytes = bytes.size(0);
  data.train_bytes = text_split_point(bytes, validation_fraction);
  data.validation_bytes = data.bytes - data.train_bytes;
  const auto cpu = bytes.cpu().contiguous();
  const auto* p = reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>());
  const auto dtype = token_dtype(tokenizer.vocab_size());
  const std::string train_text(p, static_cast<size_t>(data.train_bytes));
  internal::warn_unless_round_trip(tokenizer, train_text, path);
  const auto train_ids = tokenizer.encode(train_text).to(dtype);
  const auto validation_ids =
      tokenizer
          .encode(std::string(p + data.train_bytes,
                              static_cast<size_t>(data.validation_bytes)))
          .to(dtype);
  data.train_tokens = train_ids.size(0);
  data.validation_tokens = validation_ids.size(0);
  if (std::min(data.train_tokens, data.validation_tokens) < context + 1) {
    TORCH_CHECK(
        false, caller, ": ", quoted(path), " holds ", data.bytes,
        " bytes, which ", quoted(tokenizer.origin()), " encodes into ",
        data.train_tokens, " tokens for training and ", data.validation_tokens,
        " for validation, but each part needs at least context + 1 "
        "= ",
        context + 1, " tokens; give a longer text, or a shorter context.");
  }
  data.train = text_windows(train_ids, context);
  data.validation = text_windows(validation_ids, context);
  return data;
}

} // namespace data
} // namespace lamp
