#pragma once

/// \file
/// Text as training data for a byte-level language model: the bytes of a
/// file or a folder of files, split into training and validation parts and
/// cut into windows whose targets are the next bytes.

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "lamp/data/datasets.h"

namespace lamp {
namespace data {

/// The bytes of `path`, uint8 [n] on the CPU: a file's, or, for a folder,
/// those of its regular files in name order (symbolic links, hidden files
/// and `fortune`'s index files `*.dat` left out; subfolders not entered),
/// one after the other. Any byte text is accepted (UTF-8 stays as its
/// bytes). A file compressed with gzip or zstd (known by its first bytes;
/// zstd where lamp was built with libzstd) gives its text decompressed.
///
/// Throws c10::Error naming the path and the fix when it is missing, is
/// neither a file nor a folder, is empty (or a folder without a text file),
/// is a damaged or truncated compressed file or one of a format lamp does
/// not read (xz, bzip2, lz4, zip, 7z, Parquet), or looks binary: a NUL
/// byte, or more than 10% of bytes that are control characters other than
/// tab, newline, carriage return and form feed (the message gives the
/// offset of the first).
torch::Tensor read_text_bytes(const std::string& path);

/// A text's training and validation data (read_text_windows()).
struct TextData {
  Dataset train;                ///< windows of the first part
  Dataset validation;           ///< windows of the last part
  int64_t bytes = 0;            ///< the whole text
  int64_t train_bytes = 0;      ///< the first part's
  int64_t validation_bytes = 0; ///< the last part's
  /// The first part's tokens: its bytes, or the ids a tokenizer encoded it
  /// into (tokenized_text_windows() in lamp/data/sentencepiece.h).
  int64_t train_tokens = 0;
  int64_t validation_tokens = 0; ///< the last part's tokens
};

/// Cuts `tokens` (integers [n]: uint8 bytes, or token ids in any integer
/// type, token_dtype() the narrowest) into n' = (n - 1) / context windows of
/// `context` tokens that follow each other: window k is inputs
/// [k, :] = tokens[k context, (k + 1) context) and its targets
/// [k, :] = tokens[k context + 1, (k + 1) context + 1), each token's next
/// (both [n', context], in the tokens' type). Every token but the first is
/// a target exactly once. The inputs and the targets are two views of one
/// copy of the n' context + 1 tokens they span, the targets one token on
/// (as read_token_files()'s windows are of the mapped file), so that
/// LoaderOptions::random_windows can draw windows at any offset. Throws
/// when n < context + 1 or the tokens are not integers [n].
Dataset text_windows(const torch::Tensor& tokens, int64_t context);

/// read_text_bytes(path), split by the documented rule: the first
/// floor((1 - validation_fraction) n) bytes train, the rest validate (the
/// end of the text, as nanoGPT splits); each part cut by text_windows().
/// Throws, naming the sizes and the fix (a longer text, a shorter
/// context), when either part has fewer than context + 1 bytes; and on a
/// validation_fraction outside (0, 1) or a context below 1.
TextData read_text_windows(const std::string& path, int64_t context,
                           double validation_fraction = 0.1);

/// `bytes` (a byte-level model's sample) as valid UTF-8 that a terminal or
/// a log reader shows safely: well-formed UTF-8 sequences (shortest form,
/// no surrogates, at most U+10FFFF) and the printable ASCII, newline and tab
/// stay as they are; every other byte (control bytes, DEL, bytes of
/// ill-formed sequences) becomes the four characters "\xNN" (NN its hex
/// value, upper case), and a backslash becomes "\\", so that the text
/// reads back unambiguously.
std::string escape_text(const std::string& bytes);

/// `/usr/share/games/fortunes` (Debian's `fortunes` package: about 2.5 MB
/// of English quotations) if that folder exists, else "".
std::string default_text_path();

} // namespace data
} // namespace lamp
