#include "lamp/data/token_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/byte_pair_split.h"
#include "data/files.h"
#include "data/round_trip.h"
#include "data/split_mix.h"
#include "data/text_reader.h"
#include "lamp/data/tokens.h"
#include "platform/checkpoint_io.h"
#include "platform/worker_threads.h"

namespace lamp {
namespace data {
namespace {

using internal::quoted;

constexpr const char* kCaller = "lamp::data::write_token_files";

// The warning that fewer threads started than asked, given once a
// write_token_files() call.
class FewerThreads {
 public:
  // Warns that `started` of `asked` threads started to `what` (the system
  // said `refused`): the work goes on on those, or on the calling thread.
  void warn(int64_t started, int64_t asked, const std::string& refused,
            const char* what) {
    if (warned_) {
      return;
    }
    warned_ = true;
    TORCH_WARN(kCaller, ": ", started, " of ", asked, " threads started to ",
               what, " (the system refused the next: ", refused,
               "); the work goes on on ",
               started > 0 ? "those" : "the calling thread",
               ", more slowly. Give fewer threads (TokenFileOptions::threads, "
               "--threads), or raise the limit that refused it (ulimit -u, "
               "ulimit -v).");
  }

 private:
  bool warned_ = false;
};

// Whether every byte-level BPE split lamp has starts a piece at text[i],
// so that encoding text[0, i) and text[i, n) on their own gives the ids of
// the whole: after a line break between characters that are not white
// space (nor '/' after it), before a space between two letters, before a
// '\r' after a letter or digit (detail::byte_pair_cut_is_safe(), which says
// why).
bool safe_cut(const std::string& text, size_t i) {
  return detail::byte_pair_cut_is_safe(text, i);
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
            ::lamp::detail::StreamingFile& validation,
            FewerThreads& fewer_threads)
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
        validation_(validation),
        fewer_threads_(fewer_threads) {}

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

  // Starts encoding the jobs gathered, on the worker threads, and returns
  // to the reading while they encode: the batch before is waited for
  // first, and its ids written while this one encodes.
  void flush() {
    if (jobs_.empty()) {
      return;
    }
    auto previous = wait();
    encoding_.jobs = std::move(jobs_);
    jobs_.clear();
    pending_bytes_ = 0;
    const auto jobs = static_cast<int64_t>(encoding_.jobs.size());
    const int64_t workers = std::min(threads_, jobs);
    // A byte-level BPE merges each distinct piece once per thread, across
    // the documents it encodes.
    while (cut_ && static_cast<int64_t>(caches_.size()) < workers) {
      caches_.push_back(std::make_unique<BytePairCache>());
    }
    encoding_.next = 0;
    const auto work = [this, jobs](int64_t worker) {
      for (int64_t k = encoding_.next++; k < jobs; k = encoding_.next++) {
        auto& job = encoding_.jobs[static_cast<size_t>(k)];
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
    const int64_t started = encoding_.pool.start(workers, work);
    if (started < workers) {
      fewer_threads_.warn(started, workers, encoding_.pool.refused(), "encode");
      summary_.threads =
          std::min(summary_.threads, std::max<int64_t>(1, started));
      if (started == 0) {
        work(0);
      }
    }
    write_all(previous);
  }

  // Encodes what is gathered and writes every id: the end of the input.
  void finish() {
    flush();
    auto last = wait();
    write_all(last);
  }

  ~TokenSink() { wait(); }

 private:
  // A batch on the worker threads.
  struct Batch {
    std::vector<Job> jobs;
    ::lamp::detail::Workers pool;
    std::atomic<int64_t> next{0};
  };

  // Waits for the batch encoding (if any); its jobs.
  std::vector<Job> wait() {
    encoding_.pool.join();
    std::vector<Job> done = std::move(encoding_.jobs);
    encoding_.jobs.clear();
    return done;
  }

  // Writes the ids of `jobs`, encoded, in their order.
  void write_all(std::vector<Job>& jobs) {
    if (jobs.empty()) {
      return;
    }
    for (auto& job : jobs) {
      if (job.error) {
        std::rethrow_exception(job.error);
      }
      write(job);
    }
    if (progress_) {
      progress_(read_, input_bytes_);
    }
  }

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
  Batch encoding_;
  size_t pending_bytes_ = 0;
  std::string buffer_;
  bool round_trip_checked_ = false;
  FewerThreads& fewer_threads_;
};

// The sizes of the input files' texts (decompressed), and which of them
// are guesses (a gzip file's ISIZE) that the reading checks.
struct InputSizes {
  std::vector<int64_t> bytes;
  std::vector<bool> guessed;
  int64_t total() const {
    int64_t sum = 0;
    for (const int64_t b : bytes) {
      sum += b;
    }
    return sum;
  }
};

// A guessed size that the file's text did not match: the sizes are counted
// and the files written again.
struct SizeGuessMissed {};

// The sizes of `files`' texts: from their headers where these tell
// (internal::text_size_from_headers(); its guesses only with `guesses`),
// else counted, decompressed on up to `threads` threads (a folder of
// shards in parallel; fewer where the system refuses some, said through
// `fewer_threads`). `progress` is called from this thread with the
// bytes counted so far and a total of -1 as the count starts and every
// 50 ms until it ends; what it throws stops the count.
InputSizes text_sizes(const std::vector<std::string>& files, int64_t threads,
                      bool guesses,
                      const std::function<void(int64_t, int64_t)>& progress,
                      FewerThreads& fewer_threads) {
  InputSizes result;
  result.bytes.assign(files.size(), 0);
  result.guessed.assign(files.size(), false);
  auto& sizes = result.bytes;
  std::vector<size_t> compressed;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto header = internal::text_size_from_headers(files[i], kCaller);
    if (header.bytes >= 0 && (header.exact || guesses)) {
      sizes[i] = header.bytes;
      result.guessed[i] = !header.exact;
    } else {
      compressed.push_back(i);
    }
  }
  if (compressed.empty()) {
    return result;
  }
  std::atomic<size_t> next{0};
  std::atomic<size_t> finished{0};
  std::atomic<int64_t> counted{0};
  std::atomic<bool> stop{false};
  std::vector<std::exception_ptr> errors(files.size());
  const auto count = [&] {
    for (size_t k = next++; k < compressed.size() && !stop; k = next++) {
      const size_t i = compressed[k];
      try {
        sizes[i] = internal::text_file_size(files[i], kCaller, &counted, &stop);
      } catch (...) {
        errors[i] = std::current_exception();
        stop = true;
      }
      ++finished;
    }
  };
  const int64_t workers =
      std::min<int64_t>(threads, static_cast<int64_t>(compressed.size()));
  ::lamp::detail::Workers pool;
  const int64_t started =
      pool.start(workers, [&count](int64_t /*worker*/) { count(); });
  if (started < workers) {
    fewer_threads.warn(started, workers, pool.refused(),
                       "count the compressed text");
    if (started == 0) {
      count();
    }
  }
  std::exception_ptr stopped;
  // Once as the count starts, then every 50 ms until it ends.
  for (bool first = true; first || (finished < compressed.size() && !stop);
       first = false) {
    if (!first) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    try {
      if (progress) {
        progress(counted, -1);
      }
    } catch (...) {
      stopped = std::current_exception();
      stop = true;
    }
  }
  pool.join();
  if (stopped) {
    std::rethrow_exception(stopped);
  }
  for (const auto& error : errors) {
    if (error) {
      std::rethrow_exception(error);
    }
  }
  return result;
}

// Stops the writing as soon as `in`'s text outgrows a guessed size (the
// last of several gzip members' ISIZE, which is less than the whole text),
// rather than at the file's end: the files are written again sooner.
void check_within_guess(const InputSizes& sizes, size_t i,
                        const internal::TextReader& in) {
  if (sizes.guessed[i] && in.text_bytes() > sizes.bytes[i]) {
    throw SizeGuessMissed{};
  }
}

// Checks that `in`, read to its end, held the text size measured: a guess
// that missed starts the writing again with the sizes counted; a size
// measured that changed is an error.
void check_text_size(const InputSizes& sizes, size_t i,
                     const internal::TextReader& in) {
  if (in.text_bytes() == sizes.bytes[i]) {
    return;
  }
  if (sizes.guessed[i]) {
    throw SizeGuessMissed{};
  }
  TORCH_CHECK(false, kCaller, ": ", quoted(in.path()), " holds ",
              in.text_bytes(), " bytes of text, not the ", sizes.bytes[i],
              " it held when measured; it changed while being read. Leave "
              "the input as it is while token files are written.");
}

// kOneText: the files' bytes one after the other, split at
// text_split_point()'s byte, each part encoded as one text (cut only at
// safe_cut()s).
void write_one_text(const std::vector<std::string>& files,
                    const InputSizes& sizes, double validation_fraction,
                    TokenSink& sink, TokenFileSummary& summary) {
  const int64_t total = sizes.total();
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
    // Each byte searched once: a text without a place to cut (no two
    // words apart, no line that may be cut) is kept whole, not searched
    // again.
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
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& file = files[i];
    internal::TextReader in(file, kCaller);
    internal::TextCheck check(file, kCaller);
    while (true) {
      const size_t old = pending.size();
      const size_t got = in.read(pending, sink.batch_bytes());
      if (got == 0) {
        break;
      }
      check_within_guess(sizes, i, in);
      check.add(reinterpret_cast<const uint8_t*>(pending.data()) + old, got);
      read += static_cast<int64_t>(got);
      sink.read_up_to(read);
      advance(false);
    }
    check_text_size(sizes, i, in);
    check.finish();
  }
  advance(true);
  summary.documents = 1;
  summary.validation_bytes = total - split;
}

// Which documents validate (kFiles, kJsonLines): those whose first byte is
// in the input's end, or those drawn.
struct Holdout {
  ValidationDraw draw = ValidationDraw::kEnd;
  int64_t split = 0; // kEnd: the validating end's first byte
  double fraction = 0;
  uint64_t seed = 0;

  // Whether the document at place `document` (from 0), whose first byte is
  // the input's `start`, validates.
  bool validates(int64_t start, int64_t document) const {
    return draw == ValidationDraw::kEnd
               ? start >= split
               : drawn_for_validation(document, fraction, seed);
  }

  // How the documents that validate were chosen, for a message.
  std::string describe() const {
    return draw == ValidationDraw::kEnd
               ? c10::str("those that start in the last ", fraction,
                          " of its bytes")
               : c10::str("each drawn with probability ", fraction, ", seed ",
                          seed);
  }
};

// kFiles: each file a document, in the part `holdout` gives it.
void write_files(const std::vector<std::string>& files, const InputSizes& sizes,
                 const Holdout& holdout, TokenSink& sink,
                 TokenFileSummary& summary) {
  int64_t offset = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& file = files[i];
    const int64_t size = sizes.bytes[i];
    const bool validation = holdout.validates(offset, summary.documents);
    offset += size;
    sink.read_up_to(offset);
    if (size == 0) {
      continue;
    }
    internal::TextReader in(file, kCaller);
    std::string text;
    while (in.read(text, static_cast<size_t>(size) + 1) > 0) {
      check_within_guess(sizes, i, in);
    }
    check_text_size(sizes, i, in);
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
// document, in the part `holdout` gives it.
void write_json_lines(const std::vector<std::string>& files,
                      const InputSizes& sizes, const Holdout& holdout,
                      TokenSink& sink, TokenFileSummary& summary) {
  int64_t offset = 0;
  std::string line;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& file = files[i];
    internal::TextReader in(file, kCaller);
    int64_t number = 0;
    while (in.getline(line)) {
      check_within_guess(sizes, i, in);
      ++number;
      const int64_t start = offset;
      offset += static_cast<int64_t>(line.size()) + 1;
      sink.read_up_to(offset);
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        continue;
      }
      const bool validation = holdout.validates(start, summary.documents);
      ++summary.documents;
      summary.validation_documents += validation ? 1 : 0;
      sink.add_json_line(std::move(line),
                         quoted(file) + " line " + std::to_string(number),
                         validation);
    }
    check_text_size(sizes, i, in);
    // The next file's lines start where this one's text ends (a last line
    // without '\n' counted as if it had one above).
    offset = std::accumulate(sizes.bytes.begin(),
                             sizes.bytes.begin() + static_cast<long>(i) + 1,
                             int64_t{0});
  }
}

// Refuses token files in `folder`, and a folder that cannot be made; makes
// it, where it does not exist, when `make`.
void prepare_folder(const std::string& folder, bool make) {
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
    TORCH_CHECK(!make || ::mkdir(folder.c_str(), 0777) == 0 || errno == EEXIST,
                kCaller, ": cannot make the folder ", quoted(folder), ": ",
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

// write_token_files() with the input's text sizes measured: `base` holds
// the summary's ids and threads.
TokenFileSummary write_parts(
    const std::string& path, const Tokenizer& tokenizer,
    const std::string& folder, const TokenFileOptions& options,
    const std::vector<std::string>& files, const InputSizes& sizes,
    const TokenFileSummary& base, FewerThreads& fewer_threads) {
  TokenFileSummary summary = base;
  const auto documents = options.documents();
  const double fraction = options.validation_fraction();
  const int64_t total = sizes.total();
  TORCH_CHECK(total > 0, kCaller, ": ", quoted(path),
              " is empty; give a text with some text in it.");
  prepare_folder(folder, true);
  summary.train_path = internal::join_path(folder, "train.bin");
  summary.validation_path = internal::join_path(folder, "val.bin");
  // Unnamed until both are whole: a run killed while it writes (SIGKILL,
  // the OOM killer) leaves no temporary files behind.
  ::lamp::detail::StreamingFile train(summary.train_path, /*unnamed=*/true);
  ::lamp::detail::StreamingFile validation(summary.validation_path,
                                           /*unnamed=*/true);
  TokenSink sink(tokenizer, options, summary.threads, path, total, summary,
                 train, validation, fewer_threads);
  Holdout holdout;
  holdout.draw = options.validation_draw();
  holdout.split = internal::text_split_byte(total, fraction);
  holdout.fraction = fraction;
  holdout.seed = options.validation_seed();
  switch (documents) {
    case TextDocuments::kOneText:
      write_one_text(files, sizes, fraction, sink, summary);
      summary.bytes = total;
      break;
    case TextDocuments::kFiles:
      write_files(files, sizes, holdout, sink, summary);
      summary.bytes = total;
      break;
    case TextDocuments::kJsonLines:
      write_json_lines(files, sizes, holdout, sink, summary);
      break;
  }
  sink.finish();
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
                summary.validation_documents, " for validation (",
                holdout.describe(),
                "); each part needs one. Give more documents, another "
                "validation fraction",
                holdout.draw == ValidationDraw::kRandom ? " or seed" : "",
                ", or the input as one text.");
  }
  validation.commit();
  train.commit();
  return summary;
}

} // namespace

bool drawn_for_validation(int64_t document, double fraction, uint64_t seed) {
  TORCH_CHECK(document >= 0,
              "lamp::data::drawn_for_validation: the "
              "document's place must be >= 0, got ",
              document, ".");
  // SplitMix64's output number document + 1 for the seed, its top 53 bits
  // as a number in [0, 1).
  const uint64_t z = detail::split_mix64(
      seed + static_cast<uint64_t>(document) * detail::kSplitMixGamma);
  return static_cast<double>(z >> 11) * 0x1.0p-53 < fraction;
}

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

TextDocuments text_documents_for(const std::string& path) {
  const auto json_lines = [](const std::string& file) {
    for (const char* tail :
         {".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst"}) {
      const size_t n = std::strlen(tail);
      if (file.size() > n && file.compare(file.size() - n, n, tail) == 0) {
        return true;
      }
    }
    return false;
  };
  if (internal::path_kind(path) != internal::PathKind::kDirectory) {
    return json_lines(path) ? TextDocuments::kJsonLines
                            : TextDocuments::kOneText;
  }
  std::vector<std::string> files;
  try {
    files = internal::text_files(path, kCaller);
  } catch (const c10::Error&) {
    return TextDocuments::kOneText; // write_token_files() says why
  }
  return !files.empty() && std::all_of(files.begin(), files.end(), json_lines)
             ? TextDocuments::kJsonLines
             : TextDocuments::kOneText;
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
  TORCH_CHECK(options.validation_draw() != ValidationDraw::kRandom ||
                  documents != TextDocuments::kOneText,
              kCaller,
              ": a random draw holds out whole documents, and one text has "
              "none; read the input as documents (--documents files or "
              "jsonl), or hold out its end (--val-draw end).");
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
  prepare_folder(folder, false);
  summary.threads =
      options.threads() > 0
          ? options.threads()
          : std::max<int64_t>(1, std::thread::hardware_concurrency());
  // A folder made here is removed again where nothing is written into it.
  struct RemoveIfMade {
    std::string folder;
    bool made;
    bool keep = false;
    ~RemoveIfMade() {
      if (made && !keep) {
        ::rmdir(folder.c_str()); // only where it is empty
      }
    }
  } made{folder, internal::path_kind(folder) == internal::PathKind::kMissing};
  FewerThreads fewer_threads;
  // A gzip file's size is guessed from its last member's header; where the
  // text read does not match, the sizes are counted and the files written
  // again (nothing of the first try is kept).
  for (bool guesses = true;; guesses = false) {
    try {
      const auto sizes = text_sizes(files, summary.threads, guesses,
                                    options.progress(), fewer_threads);
      auto written = write_parts(path, tokenizer, folder, options, files, sizes,
                                 summary, fewer_threads);
      made.keep = true;
      return written;
    } catch (const SizeGuessMissed&) {
      // Counted sizes are never guesses.
      TORCH_INTERNAL_ASSERT(guesses, "a counted size missed");
    }
  }
}

} // namespace data
} // namespace lamp
