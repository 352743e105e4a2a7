#pragma once

/// \file
/// A SentencePiece tokenizer for raw text (Google's SentencePiece library,
/// Debian's `libsentencepiece-dev`): load a `.model` file (one that
/// `spm_train`, Python's `sentencepiece` or a model's release wrote, such as
/// Llama's `tokenizer.model`), or train one from a text; encode text into
/// token ids and decode ids back; cut a text into a language model's
/// windows of token ids.
///
/// Built where lamp's build found the library (CMake's
/// `LAMP_WITH_SENTENCEPIECE`, AUTO by default); elsewhere every function here
/// but sentencepiece_available() throws, naming the package to install.
/// lamp itself never links libsentencepiece: its module
/// `liblamp_sentencepiece.so` does, installed beside the library in
/// `lib/lamp/` and loaded on first use, isolated from the program's own
/// symbols (Debian's libsentencepiece carries a copy of protobuf that would
/// otherwise clash with LibTorch's). `LAMP_SENTENCEPIECE_MODULE` names
/// another path to load it from.
///
/// Example:
/// \code
///   auto tokenizer = lamp::data::SentencePiece::load("fortunes.model");
///   auto ids = tokenizer.encode("Hello, world\n");    // int64 [n]
///   std::string text = tokenizer.decode(ids);         // "Hello, world\n"
/// \endcode

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lamp/data/text.h"

namespace lamp {
namespace data {

/// Whether this lamp was built with SentencePiece.
bool sentencepiece_available();

/// How train_sentencepiece() makes a model. The defaults are those of
/// Llama's tokenizer, which read any text back exactly: BPE; no
/// normalization (Unicode forms and runs of spaces stay as they are);
/// characters outside the covered 99.95% and anything else unseen (a
/// newline, which training never sees, since it trains line by line) as
/// byte pieces `<0x0A>`; digits split one by one.
struct SentencePieceTrainOptions {
  /// Pieces in the model, the 3 control pieces (`<unk>`, `<s>`, `</s>`) and
  /// the 256 byte pieces of byte_fallback among them.
  TORCH_ARG(int64_t, vocab_size) = 4096;
  /// "bpe" or "unigram" (SentencePiece's own default).
  TORCH_ARG(std::string, model_type) = "bpe";
  /// The share of the text's characters that get pieces of their own; the
  /// rarest rest become bytes (with byte_fallback) or `<unk>`.
  TORCH_ARG(double, character_coverage) = 0.9995;
  /// Unknown characters as their UTF-8 bytes (`<0xNN>` pieces), so that
  /// decode(encode(text)) is the text.
  TORCH_ARG(bool, byte_fallback) = true;
  /// Threads SentencePiece's trainer uses.
  TORCH_ARG(int64_t, threads) = 1;
};

namespace detail {
class SentencePieceModel;
} // namespace detail

/// A SentencePiece model: a value, cheap to copy (its copies share the
/// loaded model, which is immutable and safe to use from several threads).
class SentencePiece {
 public:
  /// No model: empty() is true, and nothing else may be called.
  SentencePiece() = default;

  /// The model in the file `path` (SentencePiece's serialized ModelProto,
  /// a `.model` file). Throws c10::Error naming the file and the fix when
  /// it is missing, is not a regular file, or is not a SentencePiece model
  /// (damaged, truncated, or another kind of file), and when this lamp was
  /// built without SentencePiece.
  static SentencePiece load(const std::string& path);

  /// The model whose serialized bytes are `bytes` (serialized()'s),
  /// `origin` naming where they came from in messages.
  static SentencePiece from_serialized(const std::string& bytes,
                                       const std::string& origin);

  /// Writes the model to `path` atomically and durably
  /// (write_file_atomically()): a `.model` file that load(), `spm_encode`
  /// and Python's sentencepiece read.
  void save(const std::string& path) const;

  /// Whether there is no model (a default-constructed SentencePiece).
  bool empty() const { return impl_ == nullptr; }

  /// The pieces in the model: ids are 0 ... vocab_size() - 1.
  int64_t vocab_size() const;

  /// Where the model came from: load()'s path, from_serialized()'s origin,
  /// or "a model trained from ..." for train_sentencepiece()'s.
  const std::string& origin() const;

  /// What the model is, for a run's header: "bpe, 4096 pieces, byte
  /// fallback, normalization identity".
  std::string describe() const;

  /// `text` as the model's token ids, int64 [n] on the CPU (n may be 0 for
  /// an empty text). Text the model has no piece for becomes bytes with
  /// byte fallback, else the `<unk>` id.
  torch::Tensor encode(const std::string& text) const;

  /// The id of the model's end-of-sentence piece (`</s>`, which
  /// train_sentencepiece()'s models and Llama's have), or -1 where it has
  /// none: what ends each document in token files (write_token_files()).
  int64_t end_of_text_id() const;

  /// The text of `ids` (integers [n], any integer type, on any device).
  /// Ids outside 0 ... vocab_size() - 1 are shown as `<id>`; control
  /// pieces (`<s>`, `</s>`) as nothing, `<unk>` as SentencePiece's " ⁇ ".
  std::string decode(const torch::Tensor& ids) const;

  /// The serialized model (the `.model` file's bytes).
  std::string serialized() const;

 private:
  struct Impl;
  const detail::SentencePieceModel& model() const;
  explicit SentencePiece(std::shared_ptr<const Impl> impl)
      : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// A model trained from `text` (each of its lines a sentence; lines longer
/// than 16,384 bytes are cut there) by `options`; `origin` names the text in
/// messages and in the model's origin(). Training 4,096 pieces on the
/// training part of Debian's fortunes (2.3 MB) took 1.7 s on one core of
/// an AMD EPYC (AVX-512); encoding all 2.6 MB of it with the model, 3.2 s.
///
/// Throws c10::Error naming the fix when the text is empty, when
/// vocab_size() is too small for the text's characters and the byte pieces
/// (the message gives the smallest that fits) or too large for the text
/// (the largest), and on options SentencePiece refuses.
SentencePiece train_sentencepiece(
    const std::string& text,
    const SentencePieceTrainOptions& options = SentencePieceTrainOptions(),
    const std::string& origin = "the text");

/// Where a text of `bytes` (uint8 [n]) is split into training and
/// validation parts for a tokenizer: at floor((1 - validation_fraction) n),
/// moved forward past UTF-8 continuation bytes (at most 3), so that no
/// character is cut in two. Throws on a validation_fraction outside (0, 1).
int64_t text_split_point(const torch::Tensor& bytes,
                         double validation_fraction = 0.1);

/// `bytes` (read_text_bytes()'s, read from `path`) as a language model's
/// windows of token ids: split by text_split_point(), each part encoded by
/// `tokenizer` on its own (so that the validation tokens never depend on the
/// training text), and cut by text_windows() (ids as int16 up to 32,768
/// pieces, else int32). TextData's byte counts are the parts', and its token
/// counts the encoded parts'. Warns (TORCH_WARN) when the tokenizer does
/// not give the training part's first lines back as they are (a model that
/// normalizes the text, as spm_train's default folds newlines into spaces),
/// naming the first difference.
///
/// Throws c10::Error naming the sizes and the fix when either part encodes
/// to fewer than context + 1 tokens; and on a context below 1.
TextData tokenized_text_windows(const torch::Tensor& bytes,
                                const std::string& path,
                                const SentencePiece& tokenizer, int64_t context,
                                double validation_fraction = 0.1);

} // namespace data
} // namespace lamp
