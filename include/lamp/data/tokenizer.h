#pragma once

/// \file
/// lamp::data::Tokenizer: a SentencePiece model or a byte-level BPE
/// (GPT-2's, GPT-4's, GPT-4o's, Llama 3's kind) behind one interface, loaded from whichever file it is
/// in (Tokenizer::load() tells them apart by content), so that a program
/// takes either where it takes a tokenizer (train_gpt's `--tokenizer`).
///
/// Example:
/// \code
///   auto tokenizer = lamp::data::Tokenizer::load("gpt2.tiktoken");
///   auto ids = tokenizer.encode("hello world");  // {31373, 995}
///   std::string text = tokenizer.decode(ids);    // "hello world"
/// \endcode

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "lamp/data/byte_pair.h"
#include "lamp/data/sentencepiece.h"
#include "lamp/data/text.h"

namespace lamp {
namespace data {

/// A SentencePiece model or a byte-level BPE (a value, cheap to copy).
class Tokenizer {
 public:
  /// No model: empty() is true, and nothing else but the conversions may be
  /// called.
  Tokenizer() = default;
  /// The SentencePiece model `model` (empty if it is).
  Tokenizer(SentencePiece model); // NOLINT(google-explicit-constructor)
  /// The byte-level BPE `model` (empty if it is).
  Tokenizer(BytePairEncoding model); // NOLINT(google-explicit-constructor)

  /// The tokenizer in `path`: a folder or a JSON or tiktoken file is read
  /// by BytePairEncoding::load() (GPT-2's kind, the split the file's), any
  /// other file by
  /// SentencePiece::load() (a `.model` file). Their errors name the file
  /// and the fix.
  static Tokenizer load(const std::string& path);

  /// Whether there is no model.
  bool empty() const { return sentencepiece_.empty() && byte_pair_.empty(); }
  /// The SentencePiece model, or an empty one where it is a BPE.
  const SentencePiece& sentencepiece() const { return sentencepiece_; }
  /// The byte-level BPE, or an empty one where it is a SentencePiece model.
  const BytePairEncoding& byte_pair() const { return byte_pair_; }

  /// The ids: 0 ... vocab_size() - 1.
  int64_t vocab_size() const;
  /// Where it came from (the model's origin()).
  const std::string& origin() const;
  /// What it is, for a run's header (the model's describe()).
  std::string describe() const;
  /// `text` as token ids, int64 [n] on the CPU.
  torch::Tensor encode(const std::string& text) const;
  /// The id that ends a document (the model's end_of_text_id():
  /// `<|endoftext|>`, Llama 3's `<|end_of_text|>`, SentencePiece's `</s>`),
  /// or -1 where it has none.
  int64_t end_of_text_id() const;
  /// The text of `ids`; ids the model has no token for as `<id>`.
  std::string decode(const torch::Tensor& ids) const;

 private:
  SentencePiece sentencepiece_;
  BytePairEncoding byte_pair_;
};

/// `bytes` (read_text_bytes()'s, read from `path`) as a language model's
/// windows of token ids, as tokenized_text_windows() in
/// lamp/data/sentencepiece.h cuts them, with either kind of tokenizer.
TextData tokenized_text_windows(const torch::Tensor& bytes,
                                const std::string& path,
                                const Tokenizer& tokenizer, int64_t context,
                                double validation_fraction = 0.1);

} // namespace data
} // namespace lamp
