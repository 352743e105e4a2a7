#include "run_flags.h"

#include <lamp/lamp.h>

#include <cstdlib>
#include <type_traits>

namespace lamp_examples {
namespace {

using C = ProgramConfig;

// A stored value as the flag's type.
void parse(const std::string& text, std::string& value) {
  value = text;
}
void parse(const std::string& text, int64_t& value) {
  value = std::strtoll(text.c_str(), nullptr, 10);
}
void parse(const std::string& text, uint64_t& value) {
  value = std::strtoull(text.c_str(), nullptr, 10);
}
void parse(const std::string& text, double& value) {
  value = std::strtod(text.c_str(), nullptr);
}
void parse(const std::string& text, bool& value) {
  value = text == "true";
}

// A setting the trainer names by this flag that the table holds no value
// of (a path, a per-run choice).
RunFlag named(const char* flag, const char* key) {
  RunFlag row{};
  row.flag = flag;
  row.key = key;
  return row;
}

// A flag bound to `member`: stored under `stored` (nullptr: not stored),
// the same when equal to the stored value (or, `at_least`, not below it),
// recorded under `recorded` (nullptr: not recorded).
template <typename T>
RunFlag field(const char* flag, const char* key, const char* stored,
              const char* recorded, T C::*member, bool at_least = false) {
  RunFlag row = named(flag, key);
  row.stored = stored;
  row.recorded = recorded;
  row.is_switch = std::is_same<T, bool>::value;
  row.set = [member](C& c, const std::string& v) { parse(v, c.*member); };
  row.same = [member, at_least](const C& c, const std::string& v) {
    T stored_value{};
    parse(v, stored_value);
    return c.*member == stored_value || (at_least && stored_value < c.*member);
  };
  row.value = [member](const C& c) {
    return nlohmann::ordered_json(c.*member);
  };
  return row;
}

// The mode --precision (or --fp16) names (parsed already), as checkpoints
// store it; "auto" is resolved by the run, which the trainer compares.
bool same_precision(const C& c, const std::string& stored) {
  const auto mode = c.requested_precision;
  return mode == lamp::Precision::kAuto || lamp::to_string(mode) == stored;
}

} // namespace

const std::vector<RunFlag>& run_flags() {
  static const std::vector<RunFlag> table = [] {
    std::vector<RunFlag> t = {
        field("--model", "model", "model_name", "model", &C::model),
        // Recorded as resolved (JsonLog's "precision", "precision_auto").
        {"--precision", "precision", "precision", nullptr, false,
         [](C& c, const std::string& v) {
           c.precision = v; // a mode's name, as to_string() wrote it
           c.requested_precision = lamp::parse_precision(v);
         },
         same_precision, nullptr},
        field("--optimizer", "optimizer", "optimizer", "optimizer",
              &C::optimizer),
        field("--batch-size", "batch_size", "batch_size", "batch_size",
              &C::batch_size),
        field("--accumulation-steps", "accumulation_steps",
              "accumulation_steps", "accumulation_steps",
              &C::accumulation_steps),
        // More epochs or steps: the trainer continues a constant schedule
        // or says why not; fewer are a difference.
        field("--epochs", "epochs", "epochs", "epochs", &C::epochs,
              /*at_least=*/true),
        field("--steps", "steps", "steps", "steps", &C::steps,
              /*at_least=*/true),
        field("--lr", "lr", "lr", "lr", &C::lr),
        field("--schedule", "schedule", "schedule", "schedule", &C::schedule),
        field("--warmup-steps", "warmup_steps", "warmup_steps", "warmup_steps",
              &C::warmup_steps),
        field("--min-lr", "min_lr", "min_lr", "min_lr", &C::min_lr),
        field("--beta1", "beta1", "beta1", "beta1", &C::beta1),
        field("--beta2", "beta2", "beta2", "beta2", &C::beta2),
        field("--eval-every", "eval_every", nullptr, "eval_every",
              &C::eval_every),
        field("--checkpoint-every", "checkpoint_every", nullptr,
              "checkpoint_every", &C::checkpoint_every),
        field("--threads", "threads", nullptr, "threads", &C::threads),
        field("--momentum", "momentum", "momentum", "momentum", &C::momentum),
        field("--weight-decay", "weight_decay", "weight_decay", "weight_decay",
              &C::weight_decay),
        field("--no-bias-decay", "no_bias_decay", "no_bias_decay",
              "no_bias_decay", &C::no_bias_decay),
        field("--max-grad-norm", "max_grad_norm", "max_grad_norm",
              "max_grad_norm", &C::max_grad_norm),
        field("--zero", "zero_stage", "zero_stage", "zero", &C::zero),
        field("--seed", "seed", "seed", "seed", &C::seed),
        // train_gpt's; the run record's flags hold it where it is given.
        field("--windows", "windows", "windows", nullptr, &C::windows),
        // The FP8 recipe; "none" stored by a run outside fp8 leaves the flag
        // (check_flag_combination refuses one given without --precision
        // fp8).
        {"--fp8-scaling", "fp8_scaling", "fp8_scaling", nullptr, false,
         [](C& c, const std::string& v) {
           if (v != "none") {
             c.fp8_scaling = v;
           }
         },
         [](const C& c, const std::string& v) {
           return v == "none" || c.fp8_scaling == v;
         },
         nullptr},
        field("--fp8-amax-history", "fp8_amax_history", "fp8_amax_history",
              nullptr, &C::fp8_amax_history),
        field("--fp8-margin", "fp8_margin", "fp8_margin", nullptr,
              &C::fp8_margin),
        named("--eval-batch-size", "eval_batch_size"),
        named("--max-steps", "max_steps"),
        named("--limit-eval-batches", "limit_eval_batches"),
        named("--eval-train", "eval_train"),
        named("--eval-at-start", "eval_at_start"),
        named("--check-numerics", "check_numerics"),
        named("--cuda-graph", "cuda_graph"),
        named("--drop-last", "drop_last"),
        named("--data", "data"),
        named("--checkpoint", "checkpoint"),
        named("--resume", "resume"),
        named("--reshard", "reshard"),
        named("--init-from", "init_from"),
    };
    return t;
  }();
  return table;
}

} // namespace lamp_examples
