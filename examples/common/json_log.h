#pragma once

// The --log-json file of train_cifar10 and train_mnist: JSON Lines records
// of a run (its header, one per epoch, one per --log-every steps), every
// write checked.

#include <lamp/lamp.h>
#include <sys/types.h>
#include <nlohmann/json_fwd.hpp>

#include "options.h"

#include <cstdint>
#include <fstream>
#include <string>

namespace lamp_examples {

/// What the records say about a run besides its flags.
struct RunFacts {
  std::string program;
  torch::Device device = torch::kCPU;
  int64_t world_size = 1;
  lamp::Precision precision = lamp::Precision::kFP32; // as resolved
  bool precision_auto = false; // --precision auto chose it
  bool cuda_graph = false;     ///< whether the steps run in CUDA graphs
  // In the records as train_<examples> and test_<examples>
  // (ProgramConfig::examples: train_images, or train_gpt's
  // train_sequences).
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  int64_t start_epoch = 0; ///< the first epoch trained, 0-based
};

/// The --log-json file: one JSON object per line, {"record": kind,
/// "run_id": ..., "time": ..., fields...}, appended. The run id (start time,
/// process id, 32 random bits) tells apart runs appended to one file.
///
/// \warning Every write is checked and throws when it fails, so that a full
/// disk or a vanished file stops the run instead of losing the log. Before
/// each record the path must still name the file opened (same device and
/// inode). A log deleted or replaced during the run (the file has no link
/// left) stops it; a log moved away (renamed, as logrotate does) is
/// followed: the path is opened anew, its first record ("log_moved") says
/// where the earlier records are, and stderr says so once.
class JsonLog {
 public:
  /// Opens config.log_json for appending and writes the "run" record (the
  /// flags, versions, device, data). Refuses what is not (or would not
  /// become) a regular file before opening it: opening a FIFO without a
  /// reader blocks forever, and a device such as /dev/full or /dev/null
  /// would swallow the log.
  JsonLog(const ProgramConfig& config, RunFacts facts);
  ~JsonLog();
  JsonLog(const JsonLog&) = delete;
  JsonLog& operator=(const JsonLog&) = delete;

  /// An "epoch" record: the epoch's statistics.
  void write_epoch(const lamp::training::EpochStats& stats);

  /// A "step" record: the mean finite loss and the throughput of the steps
  /// since the last one.
  void write_step(const lamp::training::BatchProgress& progress, double loss,
                  double examples_per_second);

  /// An "interrupted" record: the run stopped on SIGINT/SIGTERM; `fields`
  /// say where, what the checkpoint holds and how to continue.
  void write_interrupted(const nlohmann::ordered_json& fields);
  /// An "evaluation" record: one of --eval-every's evaluations.
  void write_evaluation(const lamp::training::StepEvaluation& evaluation);

  /// An "error" record: why the run stopped (`message`, as stderr shows it).
  /// Never throws: when the log itself is what failed, nothing is written.
  void write_error(const std::string& message);

 private:
  void write_run(const ProgramConfig& config);
  void write(const char* kind, const nlohmann::ordered_json& fields);
  // The "train_eval" field of --eval-train's evaluation of the training
  // data: loss, accuracy, batches, batches_in_set, the examples (and a
  // language model's perplexity); null without one.
  nlohmann::ordered_json train_eval_json(
      const c10::optional<lamp::training::Evaluation>& train) const;

  std::string path_;
  // The file opened, by device and inode: checked before every write.
  dev_t device_ = 0;
  ino_t inode_ = 0;
  // The log's file, held open to tell a rename (still linked) from a
  // deletion or replacement (no link left) when the path stops naming it.
  int held_ = -1;
  // Reopens the path after the file was moved away (logrotate), with a
  // record and a warning saying where the earlier records went.
  void follow_moved_log();
  std::string run_id_;
  std::ofstream out_;
  RunFacts facts_;
  std::string model_;
  int64_t batch_size_ = 0;
  int64_t sequence_length_ = 0;  // ProgramConfig::sequence_length
  std::string examples_;         // ProgramConfig::examples: "images"
  double flops_per_example_ = 0; // ProgramConfig::flops_per_example
  double peak_flops_ = 0;        // ProgramConfig::peak_flops
};

} // namespace lamp_examples
