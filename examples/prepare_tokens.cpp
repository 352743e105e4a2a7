// Writes token files (train.bin, val.bin) from a text, a folder of
// documents or JSON Lines, as nanoGPT's data/*/prepare.py does with
// tiktoken, for train_gpt --data FOLDER:
//
//   prepare_tokens --data my_text.txt --tokenizer gpt2.tiktoken --out data/my_text
//   prepare_tokens --data openwebtext.jsonl --tokenizer gpt2.tiktoken
//       --out data/openwebtext --val-fraction 0.0005   (one command line)
#include <lamp/lamp.h>

#include <chrono>
#include <string>

#include "common/cli.h"
#include "common/output_paths.h"
#include "common/stop_signals.h"

namespace {

namespace cli = lamp_examples;

struct Config {
  std::string data = lamp::data::default_text_path();
  std::string tokenizer;
  std::string out;
  std::string documents = "auto";
  std::string json_field = "text";
  double val_fraction = 0.1;
  std::string val_draw = "end";
  uint64_t val_seed = 0;
  bool val_seed_given = false;
  std::string end_of_document = "auto";
  int64_t threads = 0;
};

// --documents auto: JSON Lines for a `.jsonl` file (compressed too) or a
// folder of them, else one text (lamp::data::text_documents_for()).
lamp::data::TextDocuments documents_of(const Config& config) {
  if (config.documents == "files") {
    return lamp::data::TextDocuments::kFiles;
  }
  if (config.documents == "jsonl") {
    return lamp::data::TextDocuments::kJsonLines;
  }
  if (config.documents == "auto") {
    return lamp::data::text_documents_for(config.data);
  }
  return lamp::data::TextDocuments::kOneText;
}

// "1.5 GB" for a count of bytes, in SI units as file managers show them.
std::string size_text(double bytes) {
  const char* units[] = {"bytes", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) {
    bytes /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes,
                units[unit]);
  return text;
}

// "12.3 s", "42 ms", "0.38 ms": a time with figures to show, never "0.0 s".
std::string time_text(double seconds) {
  char text[32];
  if (seconds >= 0.9995) { // 1.0 s, not "1000 ms"
    std::snprintf(text, sizeof text, "%.1f s", seconds);
  } else {
    std::snprintf(text, sizeof text, seconds >= 0.01 ? "%.0f ms" : "%.2f ms",
                  seconds * 1000);
  }
  return text;
}

int run(const Config& config) {
  TORCH_CHECK(!config.data.empty(),
              "no --data given and Debian's fortunes are not installed "
              "(apt-get install fortunes); give a text, a folder or a "
              ".jsonl file.");
  TORCH_CHECK(!config.val_seed_given || config.val_draw == "random",
              "--val-seed seeds the random draw, and the validating "
              "documents are the input's end (--val-draw ",
              config.val_draw,
              "); give --val-draw random as well, or leave out --val-seed.");
  const int64_t threads = cli::use_threads(config.threads);
  const auto tokenizer = lamp::data::Tokenizer::load(config.tokenizer);
  auto options = lamp::data::TokenFileOptions()
                     .documents(documents_of(config))
                     .json_field(config.json_field)
                     .validation_fraction(config.val_fraction)
                     .validation_draw(config.val_draw == "random"
                                          ? lamp::data::ValidationDraw::kRandom
                                          : lamp::data::ValidationDraw::kEnd)
                     .validation_seed(config.val_seed)
                     .threads(threads);
  if (config.end_of_document == "none") {
    options.end_documents(false);
  } else if (config.end_of_document != "auto") {
    options.end_of_document_id(std::stoll(config.end_of_document));
  }
  cli::install_stop_signals();
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  options.progress([&](int64_t done, int64_t total) {
    if (const int signal = cli::stop_signal()) {
      TORCH_CHECK(false, "stopped by ", cli::signal_name(signal)); // run()'s
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::seconds(10) || total == 0) {
      return;
    }
    last = now;
    const double seconds = std::chrono::duration<double>(now - start).count();
    if (total < 0) {
      // Compressed input, decompressed once first to learn its size.
      cli::print_out(
          "prepare_tokens: measuring the compressed input: %s of "
          "text so far, %s/s\n",
          size_text(static_cast<double>(done)).c_str(),
          size_text(static_cast<double>(done) / seconds).c_str());
      return;
    }
    cli::print_out(
        "prepare_tokens: read %s of %s (%.0f%%), %s/s\n",
        size_text(static_cast<double>(done)).c_str(),
        size_text(static_cast<double>(total)).c_str(),
        100.0 * static_cast<double>(done) / static_cast<double>(total),
        size_text(static_cast<double>(done) / seconds).c_str());
  });
  cli::print_out("prepare_tokens: '%s' as %s, with %s (%s), on %lld thread%s\n",
                 config.data.c_str(),
                 lamp::data::text_documents_name(options.documents()).c_str(),
                 config.tokenizer.c_str(), tokenizer.describe().c_str(),
                 static_cast<long long>(threads), threads == 1 ? "" : "s");
  // --out and the folders above it are made where missing, as nanoGPT's
  // os.makedirs: the library makes --out itself (and removes it again where
  // nothing is written), its parent here.
  auto parent = config.out;
  while (parent.size() > 1 && parent.back() == '/') {
    parent.pop_back();
  }
  const auto slash = parent.rfind('/');
  parent = slash == std::string::npos ? std::string() : parent.substr(0, slash);
  if (!parent.empty()) {
    const auto why = lamp_examples::make_folders(parent);
    TORCH_CHECK(why.empty(), "--out ", config.out, ": cannot make the folder ",
                parent, " above it (", why, "); give another --out.");
  }
  lamp::data::TokenFileSummary written;
  try {
    written = lamp::data::write_token_files(config.data, tokenizer, config.out,
                                            options);
  } catch (const c10::Error&) {
    const int signal = cli::stop_signal();
    if (signal == 0) {
      throw;
    }
    // Stopped, as the other programs stop: 128 + the signal's number.
    std::fprintf(stderr,
                 "prepare_tokens: stopped by %s; nothing was written (the "
                 "files are written whole or not at all)\n",
                 cli::signal_name(signal));
    return 128 + signal;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const int64_t tokens = written.train_tokens + written.validation_tokens;
  const char* width = written.id_bytes == 2 ? "uint16" : "uint32";
  std::string documents;
  if (written.end_of_document_id >= 0 ||
      options.documents() != lamp::data::TextDocuments::kOneText) {
    documents =
        std::to_string(written.documents) + " documents (" +
        std::to_string(written.validation_documents) + " validating" +
        (options.validation_draw() == lamp::data::ValidationDraw::kRandom
             ? ", drawn with seed " + std::to_string(options.validation_seed())
             : std::string()) +
        ")" +
        (written.end_of_document_id >= 0
             ? ", each ended by id " +
                   std::to_string(written.end_of_document_id)
             : std::string(", not separated")) +
        ", ";
  }
  cli::print_out(
      "prepare_tokens: %s%s of text into %lld tokens (%.2f bytes a token) in "
      "%s, %s/s\n",
      documents.c_str(), size_text(static_cast<double>(written.bytes)).c_str(),
      static_cast<long long>(tokens),
      tokens > 0
          ? static_cast<double>(written.bytes) / static_cast<double>(tokens)
          : 0.0,
      time_text(seconds).c_str(),
      size_text(static_cast<double>(written.bytes) / seconds).c_str());
  cli::print_out("prepare_tokens: wrote %s (%lld %s ids) and %s (%lld)\n",
                 written.train_path.c_str(),
                 static_cast<long long>(written.train_tokens), width,
                 written.validation_path.c_str(),
                 static_cast<long long>(written.validation_tokens));
  cli::print_out("train on them: train_gpt --data %s --tokenizer %s\n",
                 config.out.c_str(), config.tokenizer.c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{
      "Encode a text, a folder of documents or JSON Lines into token "
      "files (train.bin, val.bin) for train_gpt --data",
      "prepare_tokens"};
  app.add_option("--data", config.data,
                 "a text file, a folder of them, or JSON Lines (.jsonl); "
                 "gzip or zstd compressed too (.gz, .zst)")
      ->check(cli::non_empty_path("a text file, a folder or a .jsonl file"))
      ->capture_default_str();
  app.add_option("--tokenizer", config.tokenizer,
                 "the tokenizer: a tiktoken file, a Hugging Face "
                 "tokenizer.json (or its folder), or a SentencePiece .model")
      ->required()
      ->check(cli::non_empty_path("a tokenizer file"));
  app.add_option("--out", config.out,
                 "the folder to write train.bin and val.bin into (made if "
                 "missing; files there are never overwritten)")
      ->required()
      ->check(cli::non_empty_path("a folder"));
  app.add_option(
         "--documents", config.documents,
         "text: the input as one text, split as train_gpt splits "
         "it; files: each file a document; jsonl: each line's "
         "--json-field a document; auto: jsonl for a .jsonl file (.jsonl.gz, .jsonl.zst, .json.gz, .json.zst) or a folder of them, "
         "else text")
      ->check(CLI::IsMember({"auto", "text", "files", "jsonl"}))
      ->capture_default_str();
  app.add_option("--json-field", config.json_field,
                 "the field of each JSON line that holds its text")
      ->capture_default_str();
  app.add_option("--val-fraction", config.val_fraction,
                 "the share of the input that validates, in (0, 1): its end "
                 "by bytes, or of the documents drawn (--val-draw random)")
      ->check(cli::real_in(0, 1, /*lo_open=*/true, /*hi_open=*/true))
      ->capture_default_str();
  app.add_option("--val-draw", config.val_draw,
                 "the documents that validate: end (those in the input's "
                 "last --val-fraction, by bytes) or random (each with "
                 "probability --val-fraction, drawn from --val-seed; "
                 "documents only)")
      ->check(CLI::IsMember({"end", "random"}))
      ->capture_default_str();
  auto* val_seed =
      app.add_option("--val-seed", config.val_seed,
                     "the random draw's seed (0..2^64-1): the same seed, the "
                     "same documents")
          ->check(cli::unsigned_integer())
          ->capture_default_str();
  app.add_option("--end-of-document", config.end_of_document,
                 "the id after each document (files, jsonl): auto (the "
                 "tokenizer's <|endoftext|>, <|end_of_text|> or </s>), none, "
                 "or an id")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "auto" || value == "none") {
              return "";
            }
            const bool digits =
                !value.empty() && value.size() <= 10 &&
                value.find_first_not_of("0123456789") == std::string::npos;
            return digits ? ""
                          : "'" + value +
                                "' is not auto, none or an id (a number "
                                "from 0)";
          },
          "auto|none|ID"))
      ->capture_default_str();
  app.add_option("--threads", config.threads,
                 "threads that encode (0 = OMP_NUM_THREADS where set, else "
                 "the physical cores this process may use)")
      ->check(cli::integer_in(0, 4096))
      ->capture_default_str();
  cli::add_version_flag(app, "prepare_tokens");
  cli::SettingsSources sources; // the flags --config set, for the errors
  const int status =
      cli::parse_command_line(app, "prepare_tokens", argc, argv, {}, &sources);
  if (status >= 0) {
    return status;
  }
  config.val_seed_given = val_seed->count() > 0;
  return cli::guarded_main(
      "prepare_tokens", [&] { return run(config); }, sources);
}
