#include "lamp/data/token_writer.h"

#include <sys/stat.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/files.h"
#include "data/round_trip.h"
#include "lamp/data/tokens.h"
#include "platform/checkpoint_io.h"

namespace lamp {
namespace data {
namespace {

using internal::quoted;

constexpr const char* kCaller = "lamp::data::write_token_files";

bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool visible_ascii(char c) {
  return c >= 0x21 && c <= 0x7E;
}

// Whether every byte-level BPE split lamp has (BytePairSplit) starts a
// piece at text[i], so that encoding text[0, i) and text[i, n) on their own
// gives the ids of the whole: a line break between a visible ASCII
// character and an ASCII letter. In each pattern a piece that holds a line
// break ends with it (`\s+`, `\s*[\r\n]+`, punctuation's `[\r\n]*`), a
// letter's piece may be led by one character but never by a line break,
// and the break alone is its run of white space, so the text's end after
// it (`\s+(?!\S)`, `\s++$`, Llama 3's rule for white space that ends the
// text) takes the same piece as the letter after it does.
bool safe_cut(const std::string& text, size_t i) {
  return i >= 2 && i < text.size() && text[i - 1] == '\n' &&
         ascii_letter(text[i]) && visible_ascii(text[i - 2]);
}

// The last safe_cut() in text[from, limit], or 0 where there is none.
size_t last_safe_cut(const std::string& text, size_t from, size_t limit) {
  if (text.empty()) {
    return 0;
  }
  for (size_t i = std::min(limit, text.size() - 1);
       i >= std::max<size_t>(from, 2); --i) {
    if (safe_cut(text, i)) {
      return i;
    }
  }
  return 0;
}

// A piece of the input to encode on its own, and its ids once encoded.
struct Job {
  std::string text;
  // A JSON line's place ("'FILE' line N") where `text` is the line, whose
  // field the worker reads into `text` before it encodes; else empty.
  std::string where;
  bool validation = false;
  bool ends_document = false;
  torch::Tensor ids;
  std::exception_ptr error;
};

// The text of the JSON line `line` (at `where`): its object's string field
// `field`. Throws naming the line and the fix.
std::string json_text(const std::string& line, const std::string& field,
                      const std::string& where) {
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, kCaller, ": ", where, " is not JSON (", e.what(),
                "); each line of a JSON Lines file is one object, such as "
                "{\"",
                field, "\": \"...\"}.");
  }
  TORCH_CHECK(value.is_object(), kCaller, ": ", where, " is a JSON ",
              value.type_name(),
              ", not an object; each line of a JSON Lines file is one "
              "object, such as {\"",
              field, "\": \"...\"}.");
  const auto it = value.find(field);
  TORCH_CHECK(it != value.end(), kCaller, ": ", where, " has no field \"",
              field, "\"; name the field that holds the text (--json-field).");
  TORCH_CHECK(it->is_string(), kCaller, ": ", where, "'s \"", field,
              "\" is a JSON ", it->type_name(),
              ", not a string; name the field that holds the text "
              "(--json-field).");
  return it->get<std::string>();
}

// Encodes texts on several threads, a batch at a time, and writes their ids
// in the order the texts came, each to its part's file.
class TokenSink {
 public:
  TokenSink(const Tokenizer& tokenizer, const TokenFileOptions& options,
            int64_t threads, std::string path, int64_t input_bytes,
            TokenFileSummary& summary, ::lamp::detail::StreamingFile& train,
            ::lamp::detail::StreamingFile& validation)
      : tokenizer_(tokenizer),
        path_(std::move(path)),
        input_bytes_(input_bytes),
        progress_(options.progress()),
        json_field_(options.json_field()),
        cut_(!tokenizer.byte_pair().empty()),
        chunk_bytes_(static_cast<size_t>(options.chunk_bytes())),
        batch_bytes_(static_cast<size_t>(threads) * chunk_bytes_ * 2),
        threads_(threads),
        summary_(summary),
        train_(train),
        validation_(validation) {}

  // The bytes a batch gathers before it is encoded.
  size_t batch_bytes() const { return batch_bytes_; }
  // The input's bytes read so far, for the progress callback.
  void read_up_to(int64_t offset) { read_ = offset; }
  // Whether a text may be cut at safe_cut()s (a byte-level BPE's).
  bool cuts() const { return cut_; }

  // Adds `text` to a part: a whole document, or a piece of a text that ends
  // at a safe_cut() or at the end of its part. A byte-level BPE's text is
  // cut at safe_cut()s into pieces of about chunk_bytes for the threads.
  void add(std::string text, bool validation, bool ends_document) {
    pending_bytes_ += text.size();
    size_t start = 0;
    while (cut_ && text.size() - start > chunk_bytes_) {
      size_t i = start + chunk_bytes_;
      while (i < text.size() && !safe_cut(text, i)) {
        ++i;
      }
      if (i >= text.size()) {
        break;
      }
      push(text.substr(start, i - start), validation, false);
      start = i;
    }
    push(start == 0 ? std::move(text) : text.substr(start), validation,
         ends_document);
    if (pending_bytes_ >= batch_bytes_) {
      flush();
    }
  }

  // Adds the JSON line `line` (at `where`), a document, to a part: its
  // field is read on the thread that encodes it.
  void add_json_line(std::string line, std::string where, bool validation) {
    pending_bytes_ += line.size();
    push(std::move(line), validation, true);
    jobs_.back().where = std::move(where);
    if (pending_bytes_ >= batch_bytes_) {
      flush();
    }
  }

  // Encodes the jobs gathered and writes their ids.
  void flush() {
    const auto jobs = static_cast<int64_t>(jobs_.size());
    const int64_t workers = std::min(threads_, jobs);
    // A byte-level BPE merges each distinct piece once per thread, across
    // the documents it encodes.
    while (cut_ && static_cast<int64_t>(caches_.size()) < workers) {
      caches_.push_back(std::make_unique<BytePairCache>());
    }
    std::atomic<int64_t> next{0};
    const auto work = [&](int64_t worker) {
      for (int64_t k = next++; k < jobs; k = next++) {
        auto& job = jobs_[static_cast<size_t>(k)];
        try {
          if (!job.where.empty()) {
            job.text = json_text(job.text, json_field_, job.where);
          }
          job.ids = cut_ ? tokenizer_.byte_pair().encode(
                               job.text, *caches_[static_cast<size_t>(worker)])
                         : tokenizer_.encode(job.text);
        } catch (...) {
          job.error = std::current_exception();
        }
      }
    };
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < workers; ++t) {
      pool.emplace_back(work, t);
    }
    work(0);
    for (auto& thread : pool) {
      thread.join();
    }
    for (auto& job : jobs_) {
      if (job.error) {
        std::rethrow_exception(job.error);
      }
      write(job);
    }
    jobs_.clear();
    pending_bytes_ = 0;
    if (progress_) {
      progress_(read_, input_bytes_);
    }
  }

 private:
  void push(std::string text, bool validation, bool ends_document) {
    Job job;
    job.text = std::move(text);
    job.validation = validation;
    job.ends_document = ends_document;
    jobs_.push_back(std::move(job));
  }

  // Appends `job`'s ids (and the end-of-document id after a document's
  // last piece) to its part's file, little-endian.
  void write(const Job& job) {
    if (!round_trip_checked_ && !job.text.empty()) {
      internal::warn_unless_round_trip(tokenizer_, job.text, path_);
      round_trip_checked_ = true;
    }
    if (!job.where.empty()) {
      const auto size = static_cast<int64_t>(job.text.size());
      summary_.bytes += size;
      summary_.validation_bytes += job.validation ? size : 0;
    }
    const auto ids = job.ids.contiguous();
    const int64_t n = ids.numel();
    const auto* p = ids.data_ptr<int64_t>();
    const int64_t end_id = summary_.end_of_document_id;
    const bool end = job.ends_document && end_id >= 0;
    const auto width = static_cast<size_t>(summary_.id_bytes);
    buffer_.resize(static_cast<size_t>(n + (end ? 1 : 0)) * width);
    auto* out = reinterpret_cast<unsigned char*>(&buffer_[0]);
    const auto put = [&](int64_t id) {
      TORCH_CHECK(id >= 0 && id < summary_.vocab_size, kCaller, ": ",
                  quoted(tokenizer_.origin()), " encoded an id ", id,
                  " outside its vocabulary of ", summary_.vocab_size,
                  "; the tokenizer is damaged.");
      for (size_t b = 0; b < width; ++b) {
        *out++ = static_cast<unsigned char>(
            (static_cast<uint64_t>(id) >> (8 * b)) & 0xFF);
      }
    };
    for (int64_t k = 0; k < n; ++k) {
      put(p[k]);
    }
    if (end) {
      put(end_id);
    }
    (job.validation ? validation_ : train_)
        .write(buffer_.data(), buffer_.size());
    (job.validation ? summary_.validation_tokens : summary_.train_tokens) +=
        n + (end ? 1 : 0);
  }

  const Tokenizer& tokenizer_;
  const std::string path_;
  const int64_t input_bytes_;
  const std::function<void(int64_t, int64_t)> progress_;
  const std::string json_field_;
  std::vector<std::unique_ptr<BytePairCache>> caches_;
  int64_t read_ = 0;
  const bool cut_;
  const size_t chunk_bytes_;
  const size_t batch_bytes_;
  const int64_t threads_;
  TokenFileSummary& summary_;
  ::lamp::detail::StreamingFile& train_;
  ::lamp::detail::StreamingFile& validation_;
  std::vector<Job> jobs_;
  size_t pending_bytes_ = 0;
  std::string buffer_;
  bool round_trip_checked_ = false;
};

std::ifstream open_input(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  TORCH_CHECK(in.good(), kCaller, ": cannot open ", quoted(file), ": ",
              std::strerror(errno), "; check its permissions.");
  return in;
}

// Reads up to `size` bytes of `in` (`file`) onto the end of `text`; the
// number read.
size_t read_block(std::ifstream& in, const std::string& file, size_t size,
                  std::string& text) {
  const size_t old = text.size();
  text.resize(old + size);
  in.read(&text[old], static_cast<std::streamsize>(size));
  const auto got =
      static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0));
  text.resize(old + got);
  TORCH_CHECK(!in.bad(), kCaller, ": reading ", quoted(file),
              " failed: ", std::strerror(errno), ".");
  return got;
}

// kOneText: the files' bytes one after the other, split at
// text_split_point()'s byte, each part encoded as one text (cut only at
// safe_cut()s).
void write_one_text(const std::vector<std::string>& files, int64_t total,
                    double validation_fraction, TokenSink& sink,
                    TokenFileSummary& summary) {
  int64_t split = internal::text_split_byte(total, validation_fraction);
  bool split_final = false;
  bool train_part = true;
  std::string pending;
  int64_t consumed = 0; // the bytes before pending's first
  int64_t read = 0;     // the bytes read
  size_t searched = 0;  // pending[0, searched) holds no safe_cut()
  const auto advance = [&](bool at_end) {
    const int64_t end = consumed + static_cast<int64_t>(pending.size());
    if (train_part && !split_final && (end >= split + 3 || at_end)) {
      // As text_split_point(): forward to the start of a character.
      const auto local = static_cast<size_t>(split - consumed);
      split = internal::split_at_character(
          split, reinterpret_cast<const uint8_t*>(pending.data()) + local,
          pending.size() - std::min(local, pending.size()));
      split_final = true;
    }
    if (train_part && split_final && end >= split) {
      const auto local = static_cast<size_t>(split - consumed);
      sink.add(pending.substr(0, local), false, true);
      pending.erase(0, local);
      consumed = split;
      train_part = false;
      searched = 0;
    }
    if (at_end) {
      sink.add(std::move(pending), !train_part, true);
      pending.clear();
      return;
    }
    if (!sink.cuts() || pending.size() < sink.batch_bytes()) {
      return;
    }
    const size_t limit =
        train_part ? static_cast<size_t>(split - consumed) : pending.size();
    // Each byte searched once: a text without a place to cut (lines that
    // do not start with an ASCII letter) is kept whole, not searched again.
    const size_t cut = last_safe_cut(pending, searched, limit);
    if (cut > 0) {
      sink.add(pending.substr(0, cut), !train_part, false);
      pending.erase(0, cut);
      consumed += static_cast<int64_t>(cut);
      searched = 0;
    } else {
      searched = std::min(limit, pending.size() - 1) + 1;
    }
  };
  for (const auto& file : files) {
    auto in = open_input(file);
    internal::TextCheck check(file, kCaller);
    while (true) {
      const size_t old = pending.size();
      const size_t got = read_block(in, file, sink.batch_bytes(), pending);
      if (got == 0) {
        break;
      }
      check.add(reinterpret_cast<const uint8_t*>(pending.data()) + old, got);
      read += static_cast<int64_t>(got);
      sink.read_up_to(read);
      advance(false);
    }
    check.finish();
  }
  advance(true);
  summary.documents = 1;
  summary.validation_bytes = total - split;
}

// kFiles: each file a document, in the part its first byte falls in.
void write_files(const std::vector<std::string>& files, int64_t split,
                 TokenSink& sink, TokenFileSummary& summary) {
  int64_t offset = 0;
  for (const auto& file : files) {
    const auto size =
        static_cast<int64_t>(internal::regular_file_size(file, kCaller));
    const bool validation = offset >= split;
    offset += size;
    sink.read_up_to(offset);
    if (size == 0) {
      continue;
    }
    auto in = open_input(file);
    std::string text;
    read_block(in, file, static_cast<size_t>(size), text);
    internal::TextCheck check(file, kCaller);
    check.add(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    check.finish();
    ++summary.documents;
    summary.validation_documents += validation ? 1 : 0;
    summary.validation_bytes += validation ? size : 0;
    sink.add(std::move(text), validation, true);
  }
}

// kJsonLines: each non-blank line an object whose field `field` is a
// document, in the part the line's first byte falls in.
void write_json_lines(const std::vector<std::string>& files, int64_t split,
                      TokenSink& sink, TokenFileSummary& summary) {
  int64_t offset = 0;
  std::string line;
  for (const auto& file : files) {
    auto in = open_input(file);
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      const int64_t start = offset;
      offset += static_cast<int64_t>(line.size()) + 1;
      sink.read_up_to(offset);
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        continue;
      }
      const bool validation = start >= split;
      ++summary.documents;
      summary.validation_documents += validation ? 1 : 0;
      sink.add_json_line(std::move(line),
                         quoted(file) + " line " + std::to_string(number),
                         validation);
    }
    TORCH_CHECK(!in.bad(), kCaller, ": reading ", quoted(file),
                " failed: ", std::strerror(errno), ".");
  }
}

// Makes `folder` where it does not exist; refuses token files in it.
void prepare_folder(const std::string& folder) {
  TORCH_CHECK(!folder.empty(), kCaller,
              ": the output folder is empty; give a folder for train.bin "
              "and val.bin.");
  const auto kind = internal::path_kind(folder);
  if (kind == internal::PathKind::kMissing) {
    const auto parent = ::lamp::detail::parent_folder(folder);
    TORCH_CHECK(internal::directory_exists(parent), kCaller,
                ": the output folder ", quoted(folder),
                " does not exist, nor does its parent ", quoted(parent),
                "; make the parent first, or give another folder.");
    TORCH_CHECK(::mkdir(folder.c_str(), 0777) == 0 || errno == EEXIST, kCaller,
                ": cannot make the folder ", quoted(folder), ": ",
                std::strerror(errno),
                "; make it writable, or give another folder.");
  } else {
    TORCH_CHECK(kind == internal::PathKind::kDirectory, kCaller, ": ",
                quoted(folder),
                " is not a folder; give a folder for train.bin and val.bin.");
  }
  for (const char* name : {"train.bin", "val.bin"}) {
    const auto file = internal::join_path(folder, name);
    TORCH_CHECK(internal::path_kind(file) == internal::PathKind::kMissing,
                kCaller, ": ", quoted(file),
                " exists; token files are never overwritten. Remove them, "
                "or give another folder.");
  }
}

} // namespace

std::string text_documents_name(TextDocuments documents) {
  switch (documents) {
    case TextDocuments::kOneText:
      return "one text";
    case TextDocuments::kFiles:
      return "files";
    case TextDocuments::kJsonLines:
      return "jsonl";
  }
  return "unknown";
}

TokenFileSummary write_token_files(const std::string& path,
                                   const Tokenizer& tokenizer,
                                   const std::string& folder,
                                   const TokenFileOptions& options) {
  TORCH_CHECK(!tokenizer.empty(), kCaller, ": the tokenizer holds no model.");
  const double fraction = options.validation_fraction();
  TORCH_CHECK(fraction > 0 && fraction < 1, kCaller,
              ": validation_fraction must be in (0, 1), got ", fraction, ".");
  TORCH_CHECK(options.threads() >= 0, kCaller,
              ": threads must be >= 0 (0: the machine's), got ",
              options.threads(), ".");
  TORCH_CHECK(options.chunk_bytes() >= 64, kCaller,
              ": chunk_bytes must be >= 64, got ", options.chunk_bytes(), ".");
  TORCH_CHECK(!options.json_field().empty(), kCaller,
              ": the JSON field is empty; name the field that holds each "
              "line's text.");
  const auto documents = options.documents();
  TokenFileSummary summary;
  summary.vocab_size = tokenizer.vocab_size();
  summary.id_bytes = token_id_bytes(summary.vocab_size);
  if (documents != TextDocuments::kOneText && options.end_documents()) {
    const int64_t id = options.end_of_document_id() >= 0
                           ? options.end_of_document_id()
                           : tokenizer.end_of_text_id();
    TORCH_CHECK(options.end_of_document_id() >= -1, kCaller,
                ": end_of_document_id must be an id, or -1 for the "
                "tokenizer's end of text; got ",
                options.end_of_document_id(), ".");
    TORCH_CHECK(id >= 0, kCaller, ": ", quoted(tokenizer.origin()),
                " has no end-of-text token (<|endoftext|>, "
                "<|end_of_text|>, </s>) to end each document with; give its "
                "id (--end-of-document ID), or none (--end-of-document "
                "none).");
    TORCH_CHECK(id < summary.vocab_size, kCaller, ": the end-of-document id ",
                id, " is not below ", quoted(tokenizer.origin()),
                "'s vocabulary of ", summary.vocab_size,
                " ids; give one of its ids.");
    summary.end_of_document_id = id;
  }
  const auto files = internal::text_input_files(path, kCaller);
  int64_t total = 0;
  for (const auto& file : files) {
    total += static_cast<int64_t>(internal::regular_file_size(file, kCaller));
  }
  TORCH_CHECK(total > 0, kCaller, ": ", quoted(path),
              " is empty; give a text with some text in it.");
  prepare_folder(folder);
  summary.train_path = internal::join_path(folder, "train.bin");
  summary.validation_path = internal::join_path(folder, "val.bin");
  summary.threads =
      options.threads() > 0
          ? options.threads()
          : std::max<int64_t>(1, std::thread::hardware_concurrency());
  ::lamp::detail::StreamingFile train(summary.train_path);
  ::lamp::detail::StreamingFile validation(summary.validation_path);
  TokenSink sink(tokenizer, options, summary.threads, path, total, summary,
                 train, validation);
  const int64_t split = internal::text_split_byte(total, fraction);
  switch (documents) {
    case TextDocuments::kOneText:
      write_one_text(files, total, fraction, sink, summary);
      summary.bytes = total;
      break;
    case TextDocuments::kFiles:
      write_files(files, split, sink, summary);
      summary.bytes = total;
      break;
    case TextDocuments::kJsonLines:
      write_json_lines(files, split, sink, summary);
      break;
  }
  sink.flush();
  if (documents == TextDocuments::kOneText) {
    TORCH_CHECK(summary.train_tokens > 0 && summary.validation_tokens > 0,
                kCaller, ": ", quoted(path), " holds ", total,
                " bytes, which encode into ", summary.train_tokens,
                " tokens for training and ", summary.validation_tokens,
                " for validation; each part needs some. Give a longer "
                "text.");
  } else {
    const int64_t train_documents =
        summary.documents - summary.validation_documents;
    TORCH_CHECK(train_documents > 0 && summary.validation_documents > 0,
                kCaller, ": ", quoted(path), " holds ", summary.documents,
                " document", summary.documents == 1 ? "" : "s", ", ",
                train_documents, " for training and ",
                summary.validation_documents,
                " for validation (those that start in the last ", fraction,
                " of its bytes); each part needs one. Give more "
                "documents, another validation fraction, or the input as "
                "one text.");
  }
  validation.commit();
  train.commit();
  return summary;
}

} // namespace data
} // namespace lamp
