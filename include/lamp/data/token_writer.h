#pragma once

/// \file
/// Token files from text: write_token_files() encodes a text, a folder of
/// documents or a JSON Lines file with a tokenizer and writes nanoGPT's
/// `train.bin` and `val.bin` (read_token_files() in lamp/data/tokens.h), as
/// nanoGPT's `prepare.py` does with tiktoken, without Python and on every
/// core. Once written, a run maps the ids instead of encoding its text at
/// every start.
///
/// Example (nanoGPT's OpenWebText recipe, GPT-2's tokens, documents ended by
/// `<|endoftext|>`):
/// \code
///   auto gpt2 = lamp::data::Tokenizer::load("gpt2.tiktoken");
///   auto written = lamp::data::write_token_files(
///       "openwebtext.jsonl", gpt2, "data/openwebtext",
///       lamp::data::TokenFileOptions()
///           .documents(lamp::data::TextDocuments::kJsonLines)
///           .validation_fraction(0.0005));
///   // written.train_tokens, written.validation_tokens, ...
/// \endcode

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>

#include "lamp/data/tokenizer.h"

namespace lamp {
namespace data {

/// What write_token_files() reads as its input's documents.
enum class TextDocuments {
  /// One text: a file, or a folder's text files joined in name order
  /// (read_text_bytes()'s rule), split by bytes as tokenized_text_windows()
  /// splits it (text_split_point()), each part encoded as one text. The
  /// ids are those `train_gpt --data PATH --tokenizer FILE` trains on; no
  /// end-of-document ids.
  kOneText,
  /// Each file a document: the file, or each of a folder's text files.
  kFiles,
  /// JSON Lines (`.jsonl`, as Hugging Face's `datasets` export them): each
  /// non-blank line of the file, or of each of a folder's files, a JSON
  /// object whose field TokenFileOptions::json_field (`text`) is a
  /// document.
  kJsonLines,
};

/// Which documents write_token_files() holds out to validate.
enum class ValidationDraw {
  /// Those that start in the last TokenFileOptions::validation_fraction of
  /// the input's bytes: the end of the input, the same every run.
  kEnd,
  /// Each document on its own, with probability validation_fraction, drawn
  /// from TokenFileOptions::validation_seed and the document's place
  /// (drawn_for_validation()): a held-out share spread over the whole
  /// input, as nanoGPT draws OpenWebText's at random, the same for a seed
  /// however many threads encode. Documents only (kFiles, kJsonLines).
  kRandom,
};

/// Whether the random draw (ValidationDraw::kRandom) holds out the
/// document at `document` (0 for the input's first, counting documents
/// only: no blank JSON line nor empty file) for validation, with
/// probability `fraction` and seed `seed`: u < fraction, where u in [0, 1)
/// is the top 53 bits of SplitMix64's output number `document` + 1 for the
/// seed (the generator of Java's SplittableRandom; z = seed + (document +
/// 1) * 0x9E3779B97F4A7C15, z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9,
/// z = (z ^ z >> 27) * 0x94D049BB133111EB, z ^= z >> 31, u = (z >> 11) /
/// 2^53, all modulo 2^64). Each document is drawn on its own, so about
/// `fraction` of them validate (binomially: for 8,013,769 documents and
/// 0.0005, 4,007 give or take 63); a script can draw the same ones.
bool drawn_for_validation(int64_t document, double fraction, uint64_t seed);

/// "one text", "files" or "jsonl": the names programs take.
std::string text_documents_name(TextDocuments documents);

/// What `path` most likely holds (`prepare_tokens --documents auto`):
/// kJsonLines for a JSON Lines file by its name (`.jsonl`, or
/// `.jsonl`/`.json` compressed: `.gz`, `.zst`, as C4 and Dolma ship theirs),
/// or a folder whose text files all are; else kOneText.
TextDocuments text_documents_for(const std::string& path);

/// How write_token_files() reads and splits its input.
struct TokenFileOptions {
  /// What a document is.
  TORCH_ARG(TextDocuments, documents) = TextDocuments::kOneText;
  /// The share of the input that validates, in (0, 1): by bytes, its end
  /// (the documents that start in it, for kFiles and kJsonLines, as
  /// nanoGPT holds out whole documents); or, drawn at random, by
  /// documents (validation_draw).
  TORCH_ARG(double, validation_fraction) = 0.1;
  /// Which documents validate: the input's end (kEnd), or drawn at random
  /// (kRandom; documents only).
  TORCH_ARG(ValidationDraw, validation_draw) = ValidationDraw::kEnd;
  /// The random draw's seed: the same seed, the same documents held out.
  TORCH_ARG(uint64_t, validation_seed) = 0;
  /// The field of each JSON line that holds its text (kJsonLines).
  TORCH_ARG(std::string, json_field) = "text";
  /// Whether an id follows each document (kFiles, kJsonLines), as nanoGPT
  /// ends each of OpenWebText's with `<|endoftext|>`, so that a window
  /// across two documents sees where one ends.
  TORCH_ARG(bool, end_documents) = true;
  /// That id: -1 takes the tokenizer's end_of_text_id(); else an id below
  /// its vocabulary.
  TORCH_ARG(int64_t, end_of_document_id) = -1;
  /// Threads that encode: 0 takes the machine's (hardware_concurrency).
  TORCH_ARG(int64_t, threads) = 0;
  /// The size of the pieces a byte-level BPE's text is cut into for the
  /// threads: each cut is where the split surely starts a piece (a line
  /// break with no white space on either side and no '/' after it), so the
  /// ids are those of the whole text. A SentencePiece model's text is not
  /// cut (its encoding of a piece may differ from the whole's): one text
  /// is encoded by one thread, and documents by all of them.
  TORCH_ARG(int64_t, chunk_bytes) = int64_t{1} << 20;
  /// Called after each batch is written with the input's bytes read so far
  /// and its size (a JSON Lines file's, syntax included; decompressed).
  /// Before, while compressed input is measured (decompressed once to
  /// learn its size, where its headers do not give it), called as it
  /// starts and every 50 ms with the bytes measured so far and a size of
  /// -1. What it throws stops the writing (a program's Ctrl-C),
  /// and nothing is written.
  TORCH_ARG(std::function<void(int64_t, int64_t)>, progress) = nullptr;
};

/// What write_token_files() wrote.
struct TokenFileSummary {
  std::string train_path;      ///< FOLDER/train.bin
  std::string validation_path; ///< FOLDER/val.bin
  int64_t id_bytes = 0;        ///< 2 (uint16) or 4 (uint32): token_id_bytes()
  int64_t vocab_size = 0;      ///< the tokenizer's
  /// The id after each document, or -1 for none.
  int64_t end_of_document_id = -1;
  int64_t documents = 0;            ///< documents read (1 for kOneText)
  int64_t validation_documents = 0; ///< of them in val.bin (0 for kOneText)
  int64_t bytes = 0;                ///< the documents' text
  int64_t validation_bytes = 0;     ///< of it in val.bin
  int64_t train_tokens = 0;         ///< ids in train.bin
  int64_t validation_tokens = 0;    ///< ids in val.bin
  /// Threads that encoded: options.threads() (or the machine's), fewer
  /// where the system could not start them all (the fewest of any batch).
  int64_t threads = 0;
};

/// Encodes `path` (a text file, a folder of them, or JSON Lines, as
/// `options.documents()` says) with `tokenizer` and writes its ids into
/// `folder`'s `train.bin` and `val.bin`: little-endian uint16, or uint32
/// for a vocabulary above 65,536 (token_id_bytes()), the layout
/// read_token_files() and nanoGPT read. The input is read a piece at a
/// time (a SentencePiece model's one text whole), encoded on
/// `options.threads()` threads, and the ids written as they come.
///
/// Files compressed with gzip or zstd (known by their first bytes, not
/// their names; zstd where lamp was built with libzstd) are read
/// decompressed, and give the same token files as the files decompressed.
/// The validation part is measured on the text, whose size comes from the
/// files' headers where they give it (zstd's frame sizes; gzip's ISIZE,
/// checked against the text read: where the text outgrows it, the writing
/// stops there and starts again with the size counted), else from
/// decompressing the files once first (on `options.threads()` threads for
/// a folder of them). Where the system cannot start every thread (`ulimit
/// -u`, `ulimit -v`), the work goes on on those it started (or on the
/// calling thread), with one warning (TORCH_WARN) naming the limit, and
/// gives the same files.
///
/// Nothing is overwritten, and nothing half-written is left: the files
/// are written beside their names and renamed into place when both are
/// whole (val.bin first: a folder is token files once train.bin is there).
/// `folder` is made if it does not exist (its parent must).
///
/// Throws c10::Error naming the file and the fix, with nothing written,
/// when: `path` is missing, empty, or binary (read_text_bytes()'s rule;
/// per file); a compressed file is damaged or truncated, or in a format
/// lamp does not read (xz, bzip2, lz4, zip, 7z, Parquet: the message says
/// how to convert it); a JSON line is not an object with a string field of that
/// name (its file and line); `folder` holds `train.bin` or `val.bin`
/// already; a part would be empty (a text too short, documents that all
/// fall in one part: more documents, or another validation_fraction);
/// a random draw of one text (it has no documents to draw); documents
/// are ended but the tokenizer has no end-of-text id and none is given,
/// or the one given is not below its vocabulary; an option is out of its
/// range; or a write fails (the system's reason).
TokenFileSummary write_token_files(
    const std::string& path, const Tokenizer& tokenizer,
    const std::string& folder,
    const TokenFileOptions& options = TokenFileOptions());

} // namespace data
} // namespace lamp
