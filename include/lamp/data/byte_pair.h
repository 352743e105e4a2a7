#pragma once

/// \file
/// Byte-level byte-pair encodings (BPEs), the tokenizers of GPT-2, GPT-4
/// (cl100k_base), GPT-4o (o200k_base) and Llama 3, read from the files
/// Python's tools keep them in, so that C++ reads the token files nanoGPT's
/// `prepare.py` writes with tiktoken, prompts and samples GPT-2's own
/// weights, and fine-tunes them on text as GPT-2 saw it.
///
/// The formats (BytePairEncoding::load() tells them apart by content):
/// - tiktoken's: a `.tiktoken` file (`r50k_base.tiktoken`, `gpt2.tiktoken`,
///   `cl100k_base.tiktoken`), one token a line, its bytes in base64 and its
///   id (its rank: the lower, the earlier it merges). tiktoken keeps special
///   tokens apart: those of the encodings lamp knows by their number of
///   tokens take tiktoken's ids (cl100k_base's `<|endoftext|>` 100257, its
///   `<|fim_prefix|>` ... `<|endofprompt|>`; o200k_base's 199999 and
///   200018); any other file's `<|endoftext|>` takes the first id without a
///   token, after the last (50256 for GPT-2's 50,256 tokens) or in a gap
///   the file leaves (`p50k_base.tiktoken`'s 50256);
/// - Hugging Face's: `tokenizer.json` (a BPE model with the ByteLevel
///   pre-tokenizer, alone or after a Split by one of the patterns below,
///   as Llama 3's), or `vocab.json` with `merges.txt` beside it, which are
///   GPT-2's own release files `encoder.json` and `vocab.bpe` under other
///   names (both pairs are found beside each other). A folder holding
///   either is read too (`tokenizer.json` first).
///
/// The text is split as the tokenizer was trained to (BytePairSplit: the
/// patterns of GPT-2, cl100k_base, Llama 3 and o200k_base, with Unicode's
/// letters, marks, numbers and white space as ICU classes them), and each
/// piece's bytes are merged as tiktoken merges them (the pair of lowest
/// rank first, the leftmost among equals; from Hugging Face's files, the
/// pair of the earliest merge). So the ids are tiktoken's
/// `encode_ordinary()`'s, the encoding nanoGPT's `prepare.py` makes: the
/// text `<|endoftext|>` is text, never the special token, and no
/// begin-of-text token is added. Bytes that are not UTF-8 are each a piece
/// of their own kind, so that decode(encode(text)) is any text, byte for
/// byte. A `tokenizer.json` that splits otherwise (another pattern, a
/// normalizer, a prefix space) is refused: its ids would differ from its
/// own.
///
/// Splitting needs ICU's character classes (Debian's `libicu-dev`, found by
/// lamp's build where installed: CMake's `LAMP_WITH_ICU`, AUTO by default);
/// without them, encode() throws naming the package, and everything else
/// works (decoding a model's samples needs no classes).
///
/// Example:
/// \code
///   auto gpt2 = lamp::data::BytePairEncoding::load("gpt2.tiktoken");
///   auto ids = gpt2.encode("hello world");  // int64 {31373, 995}
///   std::string text = gpt2.decode(ids);    // "hello world"
/// \endcode

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace lamp {
namespace data {

namespace detail {
struct BytePairModel;
} // namespace detail

/// Whether this lamp can split text (built with ICU), which
/// BytePairEncoding::encode() needs.
bool byte_pair_encode_available();

/// How a byte-level BPE cuts a text into the pieces it merges within. A
/// tokenizer gives its own ids only with the split it was trained with.
enum class BytePairSplit {
  /// The file's: a `tokenizer.json` names its pattern; a tiktoken file of
  /// 100,256 tokens is cl100k_base's and one of 199,998 o200k_base's
  /// (tiktoken's files hold no pattern); any other file, GPT-2's.
  kAuto,
  /// GPT-2's (r50k_base, p50k_base: GPT-2's and GPT-3's tokenizers):
  /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
  kGpt2,
  /// cl100k_base's (GPT-4's and GPT-3.5's) as tiktoken 0.8 and later split:
  /// contractions in any case, letters led by one other character, numbers
  /// of up to three digits, punctuation with the line breaks after it.
  kCl100k,
  /// cl100k_base's pattern as Llama 3's `tokenizer.json` (and tiktoken
  /// before 0.8) has it: kCl100k's pieces, but for white space that ends
  /// the text and holds a line break, which is cut after its last one.
  kLlama3,
  /// o200k_base's (GPT-4o's): kCl100k's, with words cut where lower case
  /// turns to upper (`CamelCase` is two), contractions kept with their word.
  kO200k,
};

/// The split's name as describe() and messages give it: "GPT-2's",
/// "cl100k_base's", "Llama 3's", "o200k_base's" (and "the file's" for
/// kAuto).
std::string byte_pair_split_name(BytePairSplit split);

class BytePairEncoding;

/// The pieces a BytePairEncoding has merged, kept across texts: with one,
/// encode() merges each distinct piece once however many texts hold it,
/// which pays on many short texts (documents) that share their words. One
/// per thread (it is not safe to share); it holds up to 2^20 pieces, and
/// follows the tokenizer it is used with (another one starts it afresh).
class BytePairCache {
 public:
  BytePairCache();
  ~BytePairCache();
  BytePairCache(const BytePairCache&) = delete;
  BytePairCache& operator=(const BytePairCache&) = delete;
  /// The pieces held.
  int64_t size() const;

 private:
  friend class BytePairEncoding;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A byte-level BPE (see the file comment): a value, cheap to copy (copies
/// share the immutable model; safe to use from several threads).
class BytePairEncoding {
 public:
  /// No model: empty() is true, and nothing else may be called.
  BytePairEncoding() = default;

  /// The tokenizer in `path`: a tiktoken file, a Hugging Face
  /// `tokenizer.json`, a `vocab.json` or `encoder.json` (its merges read
  /// from `merges.txt` or `vocab.bpe` beside it), or a folder holding
  /// `tokenizer.json` or such a pair. Throws c10::Error naming the file and
  /// the fix when a file is missing, is no tokenizer of these formats, or
  /// is damaged: a line or token that cannot be read (its line or name),
  /// two tokens with one id or one token with two, a merge of tokens the
  /// vocabulary lacks, a byte without a token, a `tokenizer.json` that is
  /// not a byte-level BPE or splits the text otherwise than the patterns
  /// BytePairSplit names. `split` kAuto takes the file's split; another
  /// sets it for a file that names none (tiktoken's, `vocab.json`), and is
  /// refused where a `tokenizer.json` names another.
  static BytePairEncoding load(const std::string& path,
                               BytePairSplit split = BytePairSplit::kAuto);

  /// Whether there is no model (a default-constructed one).
  bool empty() const { return impl_ == nullptr; }

  /// The ids: 0 ... vocab_size() - 1 (the largest id + 1; an id no token
  /// has, if any, decodes as `<id>`).
  int64_t vocab_size() const;

  /// Where the tokenizer came from: load()'s path (both files of a pair).
  const std::string& origin() const;

  /// How it splits a text (never kAuto).
  BytePairSplit split() const;

  /// What it is, for a run's header, the same whatever its file's format:
  /// "byte-level BPE (GPT-2's split), 50257 ids".
  std::string describe() const;

  /// The bytes of every id in order (each one's length, then its bytes),
  /// with the special tokens' texts: what identifies the vocabulary, the
  /// same from every format (a checkpoint's fingerprint of it). Two
  /// tokenizers of equal vocabularies decode every id alike.
  std::string vocabulary_bytes() const;

  /// `text` as token ids, int64 [n] on the CPU (n is 0 for an empty text):
  /// tiktoken's `encode_ordinary()`'s (see the file comment). Throws when
  /// this lamp was built without ICU (byte_pair_encode_available()).
  torch::Tensor encode(const std::string& text) const;
  /// encode(text), with the pieces merged before taken from `cache` and
  /// those merged now added to it: the same ids.
  torch::Tensor encode(const std::string& text, BytePairCache& cache) const;

  /// The id of the special token whose text is `text` (`<|endoftext|>`),
  /// else of the vocabulary's token of those bytes (GPT-2's `vocab.json`
  /// and `encoder.json` list `<|endoftext|>` among their tokens), or -1
  /// where there is neither.
  int64_t special_id(const std::string& text) const;

  /// The id that ends a document: `<|endoftext|>` (GPT-2's, GPT-4's,
  /// GPT-4o's), else Llama 3's `<|end_of_text|>`; -1 where the tokenizer
  /// has neither.
  int64_t end_of_text_id() const;

  /// The text of `ids` (integers [n], any integer type, on any device): the
  /// tokens' bytes, one after the other, special tokens as their text, and
  /// ids without a token as `<id>`. A sample cut inside a character gives
  /// bytes that are not UTF-8; escape_text() shows them.
  std::string decode(const torch::Tensor& ids) const;

 private:
  explicit BytePairEncoding(std::shared_ptr<const detail::BytePairModel> impl)
      : impl_(std::move(impl)) {}
  const detail::BytePairModel& model() const;
  std::shared_ptr<const detail::BytePairModel> impl_;
};

} // namespace data
} // namespace lamp
