#include "training/run_settings.h"

#include <c10/util/Optional.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "lamp/training/schedule.h"
#include "platform/archive.h"
#include "training/divergence_watch.h"

namespace lamp {
namespace training {
namespace detail {
namespace {

// How a setting is stored and shown.
enum class Kind {
  kText,     // a string
  kInteger,  // int64
  kUnsigned, // uint64 stored as int64 (seeds)
  kReal,     // double, shown exactly
  kBool,     // "trained with/without it"
  kData,     // a data::fingerprint(): "trained on other data"
  kReals,    // doubles as joined() text, equal to 1e-12 of each
};

struct RunSetting {
  const char* key;          // archive key, and the key option_name() gets
  const char* library_name; // the library's name of the option
  Kind kind;
  std::function<c10::IValue(const RunContext&)> value;
  // What runs did before the checkpoint format stored this setting; none:
  // it was always stored; an IValue holding None: unknown (the setting
  // could be chosen before it was stored), so an older checkpoint is not
  // checked for it.
  c10::optional<c10::IValue> before_stored;
};

// The FP8 recipe a run's TrainStep converts with: TrainStepOptions::float8,
// else the default recipe where the precision's policy asks for FP8 (the
// rule of TrainStep's constructor); none for the other runs. "auto" never
// picks fp8 (and has no policy before it is resolved).
c10::optional<nn::Float8Recipe> float8_recipe_of(const TrainerOptions& o) {
  if (o.step().float8()) {
    return o.step().float8();
  }
  const auto precision = o.step().precision();
  if (precision != Precision::kAuto && precision_policy(precision).float8) {
    return nn::Float8Recipe();
  }
  return c10::nullopt;
}

// Values shown as text.
std::string on_off_auto(const c10::optional<bool>& value) {
  return value ? (*value ? "on" : "off") : "auto";
}

std::string joined(const std::vector<double>& values) {
  std::string text;
  for (const double value : values) {
    text += (text.empty() ? "" : ", ") + exact(value);
  }
  return text.empty() ? "none" : text;
}

// Whether two joined() lists hold as many numbers, each within 1e-12 of the
// other (relative): the same measurement rounded otherwise. "none" matches
// itself only.
bool reals_match(const std::string& a, const std::string& b) {
  const auto parse = [](const std::string& text, std::vector<double>& out) {
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
      size_t used = 0;
      try {
        out.push_back(std::stod(item, &used));
      } catch (const std::exception&) {
        return false;
      }
      if (item.find_first_not_of(' ', used) != std::string::npos) {
        return false;
      }
    }
    return !out.empty();
  };
  std::vector<double> x, y;
  if (!parse(a, x) || !parse(b, y) || x.size() != y.size()) {
    return false;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(std::abs(x[i] - y[i]) <=
          1e-12 * std::max(std::abs(x[i]), std::abs(y[i])))) {
      return false;
    }
  }
  return true;
}

// Not stored, because they change no result beyond rounding or stop a run
// rather than change it: the evaluation batch size, channels_last, CUDA
// graphs and their warm-up, the optimizer's implementation (fused, foreach),
// flat master weights, max_steps, divergence_patience; the scaler's options
// travel in its own state (TrainStep::save).
const std::vector<RunSetting>& run_settings() {
  using V = c10::IValue;
  const c10::optional<c10::IValue> unknown = V();
  static const std::vector<RunSetting> settings = {
      {"precision", "TrainerOptions::step().precision", Kind::kText,
       [](const RunContext& r) {
         return V(to_string(r.options.step().precision()));
       },
       c10::nullopt},
      {"optimizer", "TrainerOptions::optimizer().name", Kind::kText,
       [](const RunContext& r) { return V(r.options.optimizer().name()); },
       c10::nullopt},
      {"batch_size", "LoaderOptions::batch_size", Kind::kInteger,
       [](const RunContext& r) { return V(r.loader.batch_size()); },
       c10::nullopt},
      {"epochs", "TrainerOptions::epochs", Kind::kInteger,
       [](const RunContext& r) { return V(r.options.epochs()); }, c10::nullopt},
      {"lr", "TrainerOptions::optimizer().lr", Kind::kReal,
       [](const RunContext& r) { return V(r.options.optimizer().lr()); },
       c10::nullopt},
      {"schedule", "TrainerOptions::schedule", Kind::kText,
       [](const RunContext& r) { return V(to_string(r.options.schedule())); },
       c10::nullopt},
      {"momentum", "TrainerOptions::optimizer().momentum", Kind::kReal,
       [](const RunContext& r) { return V(r.options.optimizer().momentum()); },
       c10::nullopt},
      {"weight_decay", "TrainerOptions::optimizer().weight_decay", Kind::kReal,
       [](const RunContext& r) {
         return V(r.options.optimizer().weight_decay());
       },
       c10::nullopt},
      {"no_bias_decay", "TrainerOptions::optimizer().no_bias_decay",
       Kind::kBool,
       [](const RunContext& r) {
         return V(r.options.optimizer().no_bias_decay());
       },
       V(false)},
      {"accumulation_steps", "TrainerOptions::step().accumulation_steps",
       Kind::kInteger,
       [](const RunContext& r) {
         return V(r.options.step().accumulation_steps());
       },
       V(static_cast<int64_t>(1))},
      {"seed", "LoaderOptions::seed", Kind::kUnsigned,
       [](const RunContext& r) {
         return V(static_cast<int64_t>(r.loader.seed()));
       },
       c10::nullopt},
      // Stored later: checkpoints written before are not checked for them.
      // The data before the settings derived from it (mean, std).
      {"train_data", "training data", Kind::kData,
       [](const RunContext& r) { return V(r.train_data); }, unknown},
      {"test_data", "test data", Kind::kData,
       [](const RunContext& r) { return V(r.test_data); }, unknown},
      {"max_grad_norm", "TrainerOptions::step().max_grad_norm", Kind::kReal,
       [](const RunContext& r) { return V(r.options.step().max_grad_norm()); },
       unknown},
      {"nesterov", "TrainerOptions::optimizer().nesterov", Kind::kBool,
       [](const RunContext& r) { return V(r.options.optimizer().nesterov()); },
       unknown},
      {"skip_non_finite", "TrainerOptions::step().skip_non_finite", Kind::kBool,
       [](const RunContext& r) {
         return V(r.options.step().skip_non_finite());
       },
       unknown},
      {"force_loss_scaling", "TrainerOptions::step().force_loss_scaling",
       Kind::kBool,
       [](const RunContext& r) {
         return V(r.options.step().force_loss_scaling());
       },
       unknown},
      {"tf32", "TrainerOptions::step().tf32", Kind::kText,
       [](const RunContext& r) {
         return V(on_off_auto(r.options.step().tf32()));
       },
       unknown},
      {"shuffle", "LoaderOptions::shuffle", Kind::kBool,
       [](const RunContext& r) { return V(r.loader.shuffle()); }, unknown},
      {"crop_padding", "LoaderOptions::crop_padding", Kind::kInteger,
       [](const RunContext& r) { return V(r.loader.crop_padding()); }, unknown},
      {"horizontal_flip", "LoaderOptions::horizontal_flip", Kind::kBool,
       [](const RunContext& r) { return V(r.loader.horizontal_flip()); },
       unknown},
      // Measured from the data by the programs (train_mnist): values that
      // another LibTorch's sums (other threads) round otherwise are equal.
      {"mean", "LoaderOptions::mean", Kind::kReals,
       [](const RunContext& r) { return V(joined(r.loader.mean())); }, unknown},
      {"std", "LoaderOptions::std", Kind::kReals,
       [](const RunContext& r) { return V(joined(r.loader.std())); }, unknown},
      {"image_dtype", "LoaderOptions::dtype", Kind::kText,
       [](const RunContext& r) {
         return V(std::string(c10::toString(r.loader.dtype())));
       },
       unknown},
      {"num_shards", "LoaderOptions::num_shards", Kind::kInteger,
       [](const RunContext& r) { return V(r.loader.num_shards()); }, unknown},
      // Runs measured in steps and nanoGPT's schedule; older checkpoints
      // ran whole epochs with Adam's default betas.
      {"steps", "TrainerOptions::steps", Kind::kInteger,
       [](const RunContext& r) { return V(r.options.steps()); }, V(int64_t{0})},
      {"warmup_steps", "TrainerOptions::warmup_steps", Kind::kInteger,
       [](const RunContext& r) { return V(r.options.warmup_steps()); },
       V(int64_t{0})},
      {"min_lr", "TrainerOptions::min_lr", Kind::kReal,
       [](const RunContext& r) { return V(r.options.min_lr()); }, V(0.0)},
      {"beta1", "TrainerOptions::optimizer().beta1", Kind::kReal,
       [](const RunContext& r) { return V(r.options.optimizer().beta1()); },
       V(0.9)},
      {"beta2", "TrainerOptions::optimizer().beta2", Kind::kReal,
       [](const RunContext& r) { return V(r.options.optimizer().beta2()); },
       V(0.999)},
      // Older checkpoints were all whole.
      {"zero_stage", "TrainerOptions::zero_stage", Kind::kInteger,
       [](const RunContext& r) {
         return V(static_cast<int64_t>(r.options.zero_stage()));
       },
       V(int64_t{0})},
      // The FP8 recipe ("none" outside FP8; the history and margin then
      // Float8Recipe's defaults). The layers' state checks the recipe too
      // (load_float8_state), but by the library's names.
      {"fp8_scaling", "TrainerOptions::step().float8().scaling", Kind::kText,
       [](const RunContext& r) {
         const auto recipe = float8_recipe_of(r.options);
         return V(std::string(!recipe ? "none"
                              : recipe->scaling() == nn::Float8Scaling::kDelayed
                                  ? "delayed"
                                  : "current"));
       },
       unknown},
      {"fp8_amax_history", "TrainerOptions::step().float8().amax_history_len",
       Kind::kInteger,
       [](const RunContext& r) {
         return V(float8_recipe_of(r.options)
                      .value_or(nn::Float8Recipe())
                      .amax_history_len());
       },
       unknown},
      {"fp8_margin", "TrainerOptions::step().float8().margin", Kind::kInteger,
       [](const RunContext& r) {
         return V(
             float8_recipe_of(r.options).value_or(nn::Float8Recipe()).margin());
       },
       unknown},
      // Older checkpoints drew every window at a multiple of the context.
      {"windows", "LoaderOptions::random_windows", Kind::kText,
       [](const RunContext& r) {
         return V(std::string(r.loader.random_windows() ? "random" : "fixed"));
       },
       V(std::string("fixed"))},
  };
  return settings;
}

// The setting's value as a message shows it.
std::string show(Kind kind, const c10::IValue& value) {
  switch (kind) {
    case Kind::kText:
    case Kind::kData:
    case Kind::kReals:
      return value.toStringRef();
    case Kind::kInteger:
      return std::to_string(value.toInt());
    case Kind::kUnsigned:
      return std::to_string(static_cast<uint64_t>(value.toInt()));
    case Kind::kReal:
      return exact(value.toDouble());
    case Kind::kBool:
      return value.toBool() ? "true" : "false";
  }
  TORCH_INTERNAL_ASSERT(false, "lamp: unhandled run setting kind");
}

// The stored value, read with the archive's type checks.
c10::IValue read(torch::serialize::InputArchive& archive,
                 const RunSetting& setting, const char* where) {
  if (setting.before_stored) {
    c10::IValue present;
    if (!archive.try_read(setting.key, present)) {
      return *setting.before_stored;
    }
  }
  switch (setting.kind) {
    case Kind::kText:
    case Kind::kData:
    case Kind::kReals:
      return c10::IValue(
          lamp::detail::read_string(archive, setting.key, where));
    case Kind::kInteger:
    case Kind::kUnsigned:
      return c10::IValue(lamp::detail::read_int(archive, setting.key, where));
    case Kind::kReal:
      return c10::IValue(
          lamp::detail::read_number(archive, setting.key, where));
    case Kind::kBool:
      return c10::IValue(lamp::detail::read_bool(archive, setting.key, where));
  }
  TORCH_INTERNAL_ASSERT(false, "lamp: unhandled run setting kind");
}

// A checkpoint's history never grows this long (one entry per continuation
// or start from weights); a larger count is a damaged file.
constexpr int64_t kMaxHistory = 1000000;

// More epochs than the checkpoint's run was given: allowed where the
// schedule is the same whatever the run's length.
void check_may_continue(torch::serialize::InputArchive& archive,
                        const std::string& path, const RunContext& run,
                        const char* key, int64_t stored_length,
                        int64_t length) {
  const std::string where = "lamp: " + path;
  const auto stored_schedule = parse_schedule(
      lamp::detail::read_string(archive, "schedule", where.c_str()));
  if (!depends_on_length(stored_schedule)) {
    return;
  }
  const auto& o = run.options;
  const auto epochs =
      name_option(o, key, std::string("TrainerOptions::") + key);
  const auto schedule = name_option(o, "schedule", "TrainerOptions::schedule");
  TORCH_CHECK(
      false, "lamp: ", path, " was trained for ", stored_length, " ", key,
      " with ", schedule, " ", to_string(stored_schedule),
      ", whose learning rates depend on the run's length: a run of ", length,
      " ", key,
      " follows another curve, so the learning rate would jump where the first run stopped. Only a ",
      schedule, " ", to_string(Schedule::kConstant),
      " run continues with more ", epochs,
      "; to train on from these weights, start a new run with ",
      name_option(o, "init_from", "TrainerOptions::init_from"), " ", path,
      " and its own schedule, or resume with ", epochs, " ", stored_length,
      ".");
}

// The run's steps where the checkpoint stores them (0: a run of epochs, or
// a checkpoint written before the row).
int64_t stored_steps(torch::serialize::InputArchive& archive,
                     const std::string& where) {
  for (const auto& setting : run_settings()) {
    if (std::string(setting.key) == "steps") {
      const auto value = read(archive, setting, where.c_str());
      return value.isNone() ? 0 : value.toInt();
    }
  }
  return 0;
}

} // namespace

void write_run_settings(torch::serialize::OutputArchive& archive,
                        const RunContext& run) {
  for (const auto& setting : run_settings()) {
    archive.write(setting.key, setting.value(run));
  }
}

int64_t check_run_settings(torch::serialize::InputArchive& archive,
                           const std::string& path, const RunContext& run) {
  const std::string where = "lamp: " + path;
  const int64_t stored_epochs =
      lamp::detail::read_int(archive, "epochs", where.c_str());
  for (const auto& setting : run_settings()) {
    const auto stored_value = read(archive, setting, where.c_str());
    if (stored_value.isNone()) {
      continue; // an older checkpoint, which did not store it
    }
    const auto stored = show(setting.kind, stored_value);
    const auto now = show(setting.kind, setting.value(run));
    if (stored == now ||
        (setting.kind == Kind::kData &&
         data::fingerprints_match(stored, now)) ||
        (setting.kind == Kind::kReals && reals_match(stored, now))) {
      continue; // data: lamp 0.4 wrote byte sequences' fingerprints as images'
    }
    const auto name =
        name_option(run.options, setting.key, setting.library_name);
    if (std::string(setting.key) == "epochs" &&
        run.options.epochs() > stored_epochs) {
      if (run.options.steps() > 0 && stored_steps(archive, where) > 0) {
        // A run of steps lengthened: its epochs follow from its steps,
        // whose row checks it (and names --steps, not --epochs).
        continue;
      }
      check_may_continue(archive, path, run, "epochs", stored_epochs,
                         run.options.epochs());
      continue; // the schedule's own row checks that it is the same
    }
    if (std::string(setting.key) == "steps" && stored_value.toInt() > 0 &&
        run.options.steps() > stored_value.toInt()) {
      check_may_continue(archive, path, run, "steps", stored_value.toInt(),
                         run.options.steps());
      continue;
    }
    // The shards are the ranks: say so, with the way to start that many
    // (a program's namer gives its launcher, e.g. torchrun's flag), or to
    // go on with this many.
    if (std::string(setting.key) == "num_shards") {
      TORCH_CHECK(
          run.options.reshard(), "lamp: ", path, " was trained on ", stored,
          stored == "1" ? " rank" : " ranks",
          " (data shards) but this run has ", now, "; resume with ", stored,
          stored == "1" ? " rank" : " ranks", " (", name, " ", stored,
          "): each rank continues its own shard of the data. Or go on "
          "with ",
          now,
          " and a new split of the data (another global batch) "
          "with ",
          name_option(run.options, "reshard", "TrainerOptions::reshard"), ".");
      continue;
    }
    TORCH_CHECK(setting.kind != Kind::kData, "lamp: ", path,
                " was trained on other ", setting.library_name, " (", stored,
                ") than this run's (", now, "); resume with the same ",
                name_option(run.options, "data", "dataset"), ".");
    if (setting.kind == Kind::kBool) {
      const bool with = stored == "true";
      TORCH_CHECK(
          false, "lamp: ", path, " was trained ", with ? "with " : "without ",
          name, "; resume ", with ? "with" : "without",
          " it (a resumed run repeats the settings it was trained with).");
    }
    TORCH_CHECK(false, "lamp: ", path, " was trained with ", name, " ", stored,
                " but this run uses ", now, "; resume with ", name, " ", stored,
                " (a resumed run continues the same schedule and data order).");
  }
  return stored_epochs;
}

std::vector<StoredSetting> read_stored_settings(
    torch::serialize::InputArchive& archive, const std::string& path) {
  const std::string where = "lamp: " + path;
  std::vector<StoredSetting> stored;
  for (const auto& setting : run_settings()) {
    const auto value = read(archive, setting, where.c_str());
    if (!value.isNone()) {
      stored.push_back({setting.key, show(setting.kind, value)});
    }
  }
  return stored;
}

void write_history(torch::serialize::OutputArchive& archive,
                   const std::vector<RunHistoryEntry>& history) {
  torch::serialize::OutputArchive entries;
  entries.write("count", c10::IValue(static_cast<int64_t>(history.size())));
  for (size_t i = 0; i < history.size(); ++i) {
    const auto& entry = history[i];
    torch::serialize::OutputArchive written;
    written.write("kind", c10::IValue(entry.kind));
    written.write("at_epoch", c10::IValue(entry.at_epoch));
    written.write("previous_epochs", c10::IValue(entry.previous_epochs));
    written.write("epochs", c10::IValue(entry.epochs));
    written.write("source", c10::IValue(entry.source));
    written.write("previous_ranks", c10::IValue(entry.previous_ranks));
    written.write("ranks", c10::IValue(entry.ranks));
    entries.write(std::to_string(i), written);
  }
  archive.write("history", entries);
}

std::vector<RunHistoryEntry> read_history(
    torch::serialize::InputArchive& archive, const std::string& path) {
  std::vector<RunHistoryEntry> history;
  torch::serialize::InputArchive entries;
  if (!archive.try_read("history", entries)) {
    return history; // written before checkpoints kept one
  }
  const std::string where = "lamp: " + path + ": history";
  const auto count = lamp::detail::read_int(entries, "count", where.c_str());
  TORCH_CHECK(count >= 0 && count <= kMaxHistory, where, " has ", count,
              " entries; the checkpoint is damaged.");
  for (int64_t i = 0; i < count; ++i) {
    torch::serialize::InputArchive read_entry;
    lamp::detail::read_archive(entries, std::to_string(i), read_entry,
                               where.c_str());
    RunHistoryEntry entry;
    entry.kind = lamp::detail::read_string(read_entry, "kind", where.c_str());
    TORCH_CHECK(entry.kind == kContinued || entry.kind == kInitFrom ||
                    entry.kind == kResharded,
                where, " entry ", i, " is of kind '", entry.kind, "', not '",
                kContinued, "', '", kInitFrom, "' or '", kResharded,
                "'; the checkpoint is damaged or was written by a newer lamp.");
    entry.at_epoch =
        lamp::detail::read_int(read_entry, "at_epoch", where.c_str());
    entry.previous_epochs =
        lamp::detail::read_int(read_entry, "previous_epochs", where.c_str());
    entry.epochs = lamp::detail::read_int(read_entry, "epochs", where.c_str());
    entry.source =
        lamp::detail::read_string(read_entry, "source", where.c_str());
    c10::IValue ranks; // written since "resharded" entries exist
    if (read_entry.try_read("ranks", ranks)) {
      entry.previous_ranks =
          lamp::detail::read_int(read_entry, "previous_ranks", where.c_str());
      entry.ranks = lamp::detail::read_int(read_entry, "ranks", where.c_str());
    }
    history.push_back(std::move(entry));
  }
  return history;
}

void write_program_settings(torch::serialize::OutputArchive& archive,
                            const std::vector<ProgramSetting>& settings) {
  c10::List<std::string> names, values;
  c10::List<bool> checked;
  for (const auto& setting : settings) {
    names.push_back(setting.name);
    values.push_back(setting.value);
    checked.push_back(setting.checked);
  }
  torch::serialize::OutputArchive written;
  written.write("names", c10::IValue(names));
  written.write("values", c10::IValue(values));
  written.write("checked", c10::IValue(checked));
  archive.write("program_settings", written);
}

std::vector<ProgramSetting> read_program_settings(
    torch::serialize::InputArchive& archive, const std::string& path) {
  std::vector<ProgramSetting> settings;
  torch::serialize::InputArchive stored;
  if (!archive.try_read("program_settings", stored)) {
    return settings; // written before checkpoints stored them
  }
  const std::string where = "lamp: " + path + ": program settings";
  c10::IValue names, values, checked;
  const bool complete = stored.try_read("names", names) &&
                        stored.try_read("values", values) &&
                        stored.try_read("checked", checked);
  TORCH_CHECK(complete && names.isList() && values.isList() &&
                  checked.isList() &&
                  names.toListRef().size() == values.toListRef().size() &&
                  names.toListRef().size() == checked.toListRef().size(),
              where, " are damaged.");
  const auto& n = names.toListRef();
  const auto& v = values.toListRef();
  const auto& c = checked.toListRef();
  for (size_t i = 0; i < n.size(); ++i) {
    TORCH_CHECK(n[i].isString() && v[i].isString() && c[i].isBool(), where,
                " are damaged.");
    settings.push_back({n[i].toStringRef(), v[i].toStringRef(), c[i].toBool()});
  }
  return settings;
}

void check_program_settings(const std::vector<ProgramSetting>& stored,
                            const std::vector<ProgramSetting>& now,
                            const std::string& path) {
  std::string differences, fix;
  for (const auto& was : stored) {
    if (!was.checked) {
      continue;
    }
    std::string value = "(not given)";
    for (const auto& is : now) {
      if (is.name == was.name) {
        value = is.value;
      }
    }
    if (value != was.value) {
      differences += (differences.empty() ? "" : "; ") + was.name + " " +
                     was.value + " there, " + value + " here";
      fix += (fix.empty() ? "" : " ") + was.name + " " + was.value;
    }
  }
  TORCH_CHECK(differences.empty(), "lamp: ", path,
              " was trained with other settings than this run's: ", differences,
              "; resume with ", fix,
              " (a resumed run repeats the settings it was trained with).");
}

std::vector<std::pair<std::string, std::string>> describe_run_settings(
    const RunContext& run) {
  std::vector<std::pair<std::string, std::string>> described;
  for (const auto& setting : run_settings()) {
    described.emplace_back(
        name_option(run.options, setting.key, setting.library_name),
        show(setting.kind, setting.value(run)));
  }
  return described;
}

} // namespace detail
} // namespace training
} // namespace lamp
