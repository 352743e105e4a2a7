#pragma once

/// \file
/// Token files as nanoGPT prepares them: a folder with `train.bin` and
/// `val.bin`, the token ids one after the other as little-endian unsigned
/// 16-bit integers (uint32 for vocabularies above 65,536), and `meta.pkl`,
/// a pickled dict with the vocabulary's size (`vocab_size`) and, for
/// character-level data, its pieces (`itos`, `stoi`). The files are
/// memory-mapped, not read: the windows are views of the mapping, and a
/// batch reads only its own tokens.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lamp/data/datasets.h"

namespace lamp {
namespace data {

/// Whether `path` is a folder of token files: one that holds `train.bin`.
bool is_token_folder(const std::string& path);

/// The bytes an id takes in token files of a vocabulary of `vocab_size`
/// ids: 2 (uint16) up to 65,536, 4 (uint32) above. Throws c10::Error unless
/// 1 <= vocab_size <= 2^31 - 1.
int64_t token_id_bytes(int64_t vocab_size);

/// The ids of the token file `path`, memory-mapped (copy-on-write: writing
/// to the tensor never changes the file), 1-D on the CPU: int16 for
/// `id_bytes` 2 (ids of 32,768 and above read as negative numbers: widen
/// them with widen_token_ids()), int32 for 4. The mapping lives as long as
/// the tensor or a view of it. It reserves no memory: a file larger than RAM
/// and swap maps, and its pages are read as they are used. Where the system
/// overcommits strictly (`vm.overcommit_memory` 2) and refuses a writable
/// copy of a large file, the mapping is read-only, with a warning: writing
/// to the tensor then faults.
///
/// Throws c10::Error naming the file and the fix when it is missing, not a
/// regular file, empty, or not a whole number of ids (its size in bytes not
/// a multiple of `id_bytes`: a file of the other width, or a truncated one).
torch::Tensor map_token_file(const std::string& path, int64_t id_bytes);

/// `ids` (an integer tensor, any shape) as int64; with `unsigned_ids`, int16
/// ids are read as unsigned (the value modulo 65,536), as map_token_file()'s
/// uint16 files hold them.
torch::Tensor widen_token_ids(const torch::Tensor& ids, bool unsigned_ids);

/// A vocabulary's pieces: the text of each id (nanoGPT's `itos`), for
/// showing samples and encoding prompts. Empty when the data does not say
/// (token ids of a tokenizer lamp does not have, such as GPT-2's).
struct TokenPieces {
  /// pieces[id], UTF-8; as long as the largest id with a piece + 1, and
  /// empty for an id between without one
  std::vector<std::string> pieces;

  /// Whether there are pieces to encode and decode with.
  bool empty() const { return pieces.empty(); }
  /// The text of `ids` (int64 [n]): each id's piece, and `<id>` for an id
  /// without one.
  std::string decode(const torch::Tensor& ids) const;
  /// `text` as ids (int64 [n]): at each position the longest piece that
  /// matches. Throws c10::Error naming the first character no piece
  /// starts with, and its offset.
  torch::Tensor encode(const std::string& text) const;
};

/// Reads `meta_path`, nanoGPT's `meta.pkl`: its `vocab_size` (an integer)
/// and, where present, `itos` (a dict from id to text) into `pieces`.
/// Returns the vocabulary's size. Throws c10::Error naming the file and the
/// fix when it is missing, is not a pickle of a dict, or has no positive
/// integer `vocab_size`, or an `itos` that is not a dict of ids below
/// vocab_size to strings.
int64_t read_token_meta(const std::string& meta_path, TokenPieces* pieces);

/// A folder of token files as training and validation data
/// (read_token_files()).
struct TokenData {
  Dataset train;      ///< windows of train.bin (views of its mapping)
  Dataset validation; ///< windows of val.bin
  /// The data's vocabulary: meta.pkl's `vocab_size`, else the one given.
  int64_t vocab_size = 0;
  int64_t id_bytes = 0;          ///< 2 (uint16) or 4 (uint32)
  int64_t train_tokens = 0;      ///< ids in train.bin
  int64_t validation_tokens = 0; ///< ids in val.bin
  std::string meta_path;         ///< meta.pkl when read, else ""
  TokenPieces pieces;            ///< meta.pkl's itos, when it has one
};

/// The token files of `folder` (nanoGPT's layout: `train.bin`, `val.bin`,
/// `meta.pkl`) cut into windows of `context` tokens by the rule of
/// text_windows(), without copying: the windows are views of the mapped
/// files (map_token_file()), and a uint16 file of a vocabulary above 32,768
/// is held as int16 with Dataset::unsigned_ids set. The vocabulary is
/// meta.pkl's `vocab_size` when the folder holds one, else `vocab_size`
/// (0: none given); the ids' width follows it (token_id_bytes()).
///
/// Every id is checked to be below the vocabulary, in one pass over each
/// file without a copy of it (on one core of a 2-core AMD EPYC, 524 M
/// uint16 ids, 1 GB, cost about 1.4 s: some 25 s for nanoGPT's OpenWebText
/// of 9 billion).
/// Throws c10::Error naming the file and the fix when the folder lacks
/// train.bin or val.bin, a file is empty, holds fewer than context + 1 ids,
/// is not a whole number of ids, or holds an id at or above the vocabulary
/// (naming the first one and its position); when there is no meta.pkl and
/// `vocab_size` is 0; and when meta.pkl cannot be read (read_token_meta()).
TokenData read_token_files(const std::string& folder, int64_t context,
                           int64_t vocab_size = 0);

/// The vocabulary a model of the data `vocab_size` gets when none is given:
/// rounded up to a multiple of 64, as nanoGPT pads GPT-2's 50,257 to
/// 50,304 (the products of the output head run on whole tiles; the extra
/// ids are never targets, so training pushes their logits down).
int64_t padded_vocab_size(int64_t vocab_size);

} // namespace data
} // namespace lamp
