#include "json_log.h"

#include <fcntl.h>
#include <lamp/version.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>
#include <cmath>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <utility>

#include "run_flags.h"

namespace lamp_examples {
namespace {

// The current time in UTC as ISO 8601 with milliseconds.
std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                          now.time_since_epoch())
                          .count() %
                      1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[80]; // room for any int the compiler cannot rule out
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour,
                utc.tm_min, utc.tm_sec, static_cast<int>(millis));
  return text;
}

// A run's id: its start time, the process id and 32 random bits, so that
// runs appended to one log file can be told apart.
std::string new_run_id() {
  std::string id = utc_now();
  id.erase(std::remove_if(id.begin(), id.end(),
                          [](char c) { return c == '-' || c == ':'; }),
           id.end());
  id = id.substr(0, id.find('.')) + "Z";
  char tail[32];
  std::snprintf(tail, sizeof(tail), "-%d-%08x", static_cast<int>(getpid()),
                static_cast<unsigned>(std::random_device{}()));
  return id + tail;
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode))
    return "directory";
  if (S_ISFIFO(mode))
    return "FIFO";
  if (S_ISCHR(mode))
    return "character device";
  if (S_ISBLK(mode))
    return "block device";
  if (S_ISSOCK(mode))
    return "socket";
  return "special file";
}

} // namespace

JsonLog::JsonLog(const ProgramConfig& config, RunFacts facts)
    : path_(config.log_json),
      run_id_(new_run_id()),
      facts_(std::move(facts)),
      model_(config.model),
      batch_size_(config.batch_size),
      sequence_length_(config.sequence_length),
      examples_(config.examples),
      flops_per_example_(config.flops_per_example),
      peak_flops_(config.peak_flops) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    TORCH_CHECK(S_ISREG(st.st_mode), "--log-json ", path_,
                " exists and is not a regular file (a ", file_kind(st.st_mode),
                "); give the path of a JSON Lines file to append to.");
  }
  errno = 0;
  out_.open(path_, std::ios::app);
  TORCH_CHECK(out_.is_open(), "--log-json: cannot open ", path_,
              " for appending (", std::strerror(errno),
              "); check that its folder exists and is writable.");
  // The file opened: written records must go on reaching it (see write()).
  TORCH_CHECK(::stat(path_.c_str(), &st) == 0, "--log-json: cannot stat ",
              path_, " after opening it (", std::strerror(errno), ").");
  device_ = st.st_dev;
  inode_ = st.st_ino;
  held_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  write_run(config);
}

JsonLog::~JsonLog() {
  if (held_ >= 0) {
    ::close(held_);
  }
}

void JsonLog::follow_moved_log() {
  // Where the file went, as the kernel names the descriptor held open.
  std::string moved_to = "an unknown path";
  char target[4096];
  const auto link = "/proc/self/fd/" + std::to_string(held_);
  const auto length = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (length > 0) {
    moved_to = std::string(target, static_cast<size_t>(length));
  }
  out_.close();
  errno = 0;
  out_.open(path_, std::ios::app);
  struct stat st {};
  TORCH_CHECK(out_.is_open() && ::stat(path_.c_str(), &st) == 0,
              "--log-json: ", path_, " was moved to ", moved_to,
              " during the run and cannot be opened anew (",
              std::strerror(errno), "); stopping.");
  ::close(held_);
  held_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  device_ = st.st_dev;
  inode_ = st.st_ino;
  std::fprintf(stderr,
               "%s: warning: --log-json %s was moved to %s during the run; "
               "the records go on in a new %s.\n",
               facts_.program.c_str(), path_.c_str(), moved_to.c_str(),
               path_.c_str());
  write("log_moved", {{"earlier_records", moved_to}});
}

void JsonLog::write_run(const ProgramConfig& config) {
  const auto cuda = lamp::cuda_versions();
  // Every flag's value, from the table the ranks compare (rank_check.h):
  // a flag added to a program is recorded without a list to update.
  nlohmann::ordered_json flags = nlohmann::ordered_json::object();
  for (const auto& flag :
       config.logged_flags.empty() ? config.rank_flags : config.logged_flags) {
    flags[flag.first] = flag.second;
  }
  nlohmann::ordered_json record = {
      {"program", facts_.program},
      {"command_line", config.command_line},
      {"lamp_version", LAMP_VERSION},
      {"torch_version", TORCH_VERSION},
      {"libtorch", lamp::libtorch_version()},
      {"cuda", cuda.empty() ? nlohmann::ordered_json(nullptr)
                            : nlohmann::ordered_json(cuda)},
      {"device", facts_.device.str()},
      {"device_name", lamp::device_name(facts_.device)},
      {"world_size", facts_.world_size},
      {"precision", lamp::to_string(facts_.precision)},
      {"precision_auto", facts_.precision_auto}};
  // The settings of the programs' table (run_flags.h), by their names.
  for (const auto& row : run_flags()) {
    if (row.recorded != nullptr) {
      record[row.recorded] = row.value(config);
    }
  }
  record["cuda_graph"] = facts_.cuda_graph;
  record["train_" + examples_] = facts_.train_examples;
  record["test_" + examples_] = facts_.test_examples;
  record["start_epoch"] = facts_.start_epoch + 1;
  record["resume"] = config.resume;
  record["flags"] = flags;
  write("run", record);
}

void JsonLog::write_epoch(const lamp::training::EpochStats& s) {
  nlohmann::ordered_json record = {
      {"program", facts_.program},
      {"model", model_},
      {"precision", lamp::to_string(facts_.precision)},
      {"device", facts_.device.str()},
      {"batch_size", batch_size_},
      {"epoch", s.epoch},
      {"steps", s.steps},
      {"resumed_steps", s.resumed_steps},
      {"steps_in_epoch", s.steps_in_epoch},
      {"partial", s.partial()},
      {"global_step", s.global_step},
      {"train_loss", s.train_loss},
      {"evaluated", s.evaluated},
      {"test_loss", s.test_loss},
      {"test_accuracy", s.test_accuracy},
      {"test_subset", s.test_subset()},
      {"test_batches", s.test_batches},
      {"test_batches_in_set", s.test_batches_in_set},
      {"test_" + examples_, s.test_examples},
      {"seconds", s.seconds},
      {"warmup_seconds", s.warmup_seconds},
      {"eval_seconds", s.eval_seconds},
      {examples_ + "_per_second", s.examples_per_second},
      {"peak_memory_bytes", s.peak_memory_bytes},
      {"loss_scale", s.loss_scale},
      {"skipped_steps", s.skipped_steps},
      {"non_finite_losses", s.non_finite_losses},
      {"lr", s.lr},
      {"checkpoint_written", s.checkpoint_written}};
  record["train_eval"] = train_eval_json(s.train_evaluation);
  if (sequence_length_ > 0) {
    // A language model's: per-token rates and perplexities, exp(loss).
    record["context"] = sequence_length_;
    record["tokens_per_second"] = s.tokens_per_second;
    record["train_perplexity"] = lamp::training::perplexity(s.train_loss);
    // Nothing evaluated (--eval-every): no perplexity, not exp(0) = 1.
    record["test_perplexity"] =
        s.evaluated ? nlohmann::ordered_json(s.test_perplexity())
                    : nlohmann::ordered_json(nullptr);
  }
  if (flops_per_example_ > 0) {
    // Model FLOPs utilisation: the model's FLOPs per second over the
    // device's peak; null where the peak is not known (a CPU without
    // --peak-tflops).
    const auto flops = s.examples_per_second * flops_per_example_;
    record["model_flops_per_second"] = flops;
    record["peak_flops"] = peak_flops_ > 0 ? nlohmann::ordered_json(peak_flops_)
                                           : nlohmann::ordered_json(nullptr);
    record["mfu"] = peak_flops_ > 0
                        ? nlohmann::ordered_json(flops / peak_flops_)
                        : nlohmann::ordered_json(nullptr);
  }
  write("epoch", record);
}

nlohmann::ordered_json JsonLog::train_eval_json(
    const c10::optional<lamp::training::Evaluation>& train) const {
  if (!train) {
    return nullptr; // no --eval-train, or an epoch not evaluated
  }
  nlohmann::ordered_json record = {{"loss", train->loss},
                                   {"accuracy", train->accuracy},
                                   {"batches", train->batches},
                                   {"batches_in_set", train->batches_in_set},
                                   {examples_, train->examples}};
  if (sequence_length_ > 0) {
    record["perplexity"] = train->perplexity();
  }
  return record;
}

void JsonLog::write_step(const lamp::training::BatchProgress& p, double loss,
                         double examples_per_second) {
  nlohmann::ordered_json record = {
      {"epoch", p.epoch},
      {"batch", p.batch},
      {"global_step", p.global_step},
      {"loss", loss},
      {examples_ + "_per_second", examples_per_second},
      {"loss_scale",
       p.loss_scale.defined() ? p.loss_scale.item<double>() : 1.0},
      {"lr", p.lr},
      {"grad_norm", p.grad_norm.defined()
                        ? nlohmann::ordered_json(p.grad_norm.item<double>())
                        : nlohmann::ordered_json(nullptr)},
      {"warmup", p.warmup}};
  if (sequence_length_ > 0) {
    record["tokens_per_second"] =
        examples_per_second * static_cast<double>(sequence_length_);
  }
  write("step", record);
}

void JsonLog::write_evaluation(const lamp::training::StepEvaluation& e) {
  nlohmann::ordered_json record = {
      {"global_step", e.global_step},
      {"epoch", e.epoch},
      {"train_loss", e.train_loss},
      {"test_loss", e.test_loss},
      {"test_accuracy", e.test_accuracy},
      {"test_batches", e.test_batches},
      {"test_batches_in_set", e.test_batches_in_set},
      {"test_" + examples_, e.test_examples},
      {"lr", e.lr},
      {"eval_seconds", e.eval_seconds},
      {"best_test_loss", e.best_test_loss},
      {"best_written", e.best_written},
      {"checkpoint_written", e.checkpoint_written},
      {"before_training", e.before_training}};
  record["train_eval"] = train_eval_json(e.train_evaluation);
  if (sequence_length_ > 0) {
    record["train_perplexity"] = lamp::training::perplexity(e.train_loss);
    record["test_perplexity"] = e.test_perplexity();
  }
  write("evaluation", record);
}

void JsonLog::write_interrupted(const nlohmann::ordered_json& fields) {
  write("interrupted", fields);
}

void JsonLog::write_error(const std::string& message) {
  try {
    write("error", {{"message", message}});
  } catch (const std::exception&) {
    // The log itself failed (the reason the run stops, or a second one):
    // the message still reaches stderr.
  }
}

void JsonLog::write(const char* kind, const nlohmann::ordered_json& fields) {
  // A log deleted or replaced while the run writes it would take the records
  // nobody can read any more: stop instead. One moved away (still linked)
  // is followed.
  struct stat st {};
  const bool same_file = ::stat(path_.c_str(), &st) == 0 &&
                         st.st_dev == device_ && st.st_ino == inode_;
  if (!same_file) {
    struct stat held {};
    const bool moved =
        held_ >= 0 && ::fstat(held_, &held) == 0 && held.st_nlink > 0;
    TORCH_CHECK(
        moved, "--log-json: ", path_,
        " was deleted or replaced during the run, so its records would be lost; stopping. Give a --log-json that stays in place (moving it away, as logrotate does, is fine).");
    follow_moved_log();
  }
  nlohmann::ordered_json line = {
      {"record", kind}, {"run_id", run_id_}, {"time", utc_now()}};
  for (const auto& item : fields.items()) {
    line[item.key()] = item.value();
  }
  errno = 0;
  // Paths and arguments are bytes on Linux, not always UTF-8 (a Latin-1
  // file name): such bytes are written as U+FFFD, so every line stays JSON
  // and the run goes on, as it does without --log-json.
  out_ << line.dump(-1, ' ', false,
                    nlohmann::ordered_json::error_handler_t::replace)
       << "\n";
  out_.flush();
  TORCH_CHECK(
      out_.good(), "--log-json: writing to ", path_, " failed (",
      errno != 0 ? lamp::io_error_text(errno) : "stream error",
      "); the log is incomplete. Free space on its disk or give another --log-json.");
}

} // namespace lamp_examples
