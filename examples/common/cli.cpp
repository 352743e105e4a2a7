#include "cli.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <lamp/amp/precision.h>
#include <lamp/platform/address_space.h>
#include <lamp/platform/backends.h>
#include <lamp/platform/warnings.h>
#include <lamp/version.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>

namespace lamp_examples {
namespace {

// The whole of `text` as a decimal integer (optional sign); false for
// anything else, including values beyond int64.
bool parse_integer(const std::string& text, int64_t& value) {
  if (text.empty() ||
      text.find_first_not_of("+-0123456789") != std::string::npos) {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) {
    return false;
  }
  value = parsed;
  return true;
}

// The name of the integer validators, by which parse_command_line() finds
// the flags they check.
const char* const kIntegerCheck = "lamp-integer";

// `text` without the leading zeros of a decimal integer ("010" -> "10",
// "-007" -> "-7", "00" -> "0"); anything else is left for the checks.
std::string drop_leading_zeros(std::string& text) {
  const size_t sign =
      !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  if (text.size() <= sign + 1 ||
      text.find_first_not_of("0123456789", sign) != std::string::npos) {
    return "";
  }
  const size_t first = text.find_first_not_of('0', sign);
  text.erase(sign, std::min(first, text.size() - 1) - sign);
  return "";
}

// CLI11 converts integers with strtoll(text, nullptr, 0) (2.1.2), which
// reads "010" as octal 8 and refuses "08", whereas the checks read decimal:
// every flag of `app` (and of its option groups) that an integer validator
// checks gets its text without leading zeros first. (A transform runs
// before the checks; a check may not change the text.)
// An integer flag without one of those checks would still be read by CLI11
// alone (octal, CLI11's messages): the program is refused until it has one.
void read_integers_as_decimal(CLI::App& app) {
  for (auto* option : app.get_options()) {
    try {
      option->get_validator(kIntegerCheck);
    } catch (const CLI::OptionNotFound&) {
      // CLI11 names an integer option's type INT or UINT ("INT:..." with a
      // described check).
      const auto type = option->get_type_name();
      const bool integer =
          type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0;
      TORCH_CHECK(!integer, "the flag ", option->get_name(),
                  " reads an integer without lamp_examples' integer checks; "
                  "give it ->check(integer_in(...)), integer_at_least(...) "
                  "or unsigned_integer(), which read it as decimal.");
      continue; // not an integer flag
    }
    option->transform(CLI::Validator(drop_leading_zeros, ""));
  }
  for (auto* group : app.get_subcommands([](CLI::App*) { return true; })) {
    read_integers_as_decimal(*group);
  }
}

// The message for text that parse_integer() refuses.
std::string not_an_integer(const std::string& text) {
  const bool digits = !text.empty() && text.find_first_not_of("+-0123456789") ==
                                           std::string::npos;
  return "'" + text + "' is not an integer" +
         (digits ? " that fits in 64 bits" : "");
}

bool parse_real(const std::string& text, double& value) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && errno != ERANGE &&
         std::isfinite(value);
}

std::string one_line(std::string text) {
  for (auto& c : text) {
    if (c == '\n' || c == '\r') {
      c = ' ';
    }
  }
  while (!text.empty() && text.back() == ' ') {
    text.pop_back();
  }
  return text;
}

// CLI11's words for a flag given twice or without its value, as lamp's
// other usage errors say them; any other message as it is.
std::string usage_words(const std::string& message) {
  static const std::regex twice(
      R"(^(--[A-Za-z0-9_-]+): At Most 1 required but received (\d+)$)");
  static const std::regex missing(
      R"(^(--[A-Za-z0-9_-]+): 1 required (\S+) missing$)");
  std::smatch m;
  if (std::regex_match(message, m, twice)) {
    return m[1].str() + " is given " + m[2].str() + " times; give it once";
  }
  if (std::regex_match(message, m, missing)) {
    return m[1].str() + " needs a value (" + m[2].str() +
           "); give one after it, or leave the flag out";
  }
  return message;
}

// "" or the usage error for an empty item in a delimited flag's value
// ("--prompt-ids 1,,2", "1,2,"): CLI11 splits the value and drops the
// empty items without a word, so a typo would give another list. Values
// in several arguments may end or start with the delimiter where another
// follows or comes before ("--prompt-ids 1, 2").
std::string empty_list_item(const CLI::App& app,
                            const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      break; // positional arguments only after it
    }
    if (args[i].rfind("--", 0) != 0) {
      continue;
    }
    const auto equals = args[i].find('=');
    const auto* option = app.get_option_no_throw(args[i].substr(0, equals));
    if (option == nullptr || option->get_delimiter() == '\0') {
      continue;
    }
    const char comma = option->get_delimiter();
    // Its values: after '=', else the arguments up to the next flag.
    std::vector<std::string> values;
    if (equals != std::string::npos) {
      values.push_back(args[i].substr(equals + 1));
    }
    for (size_t j = i + 1;
         equals == std::string::npos && j < args.size() && args[j][0] != '-';
         ++j) {
      values.push_back(args[j]);
    }
    for (size_t k = 0; k < values.size(); ++k) {
      const auto& value = values[k];
      if (!value.empty() &&
          ((k == 0 && value.front() == comma) ||
           (k + 1 == values.size() && value.back() == comma) ||
           value.find(std::string(2, comma)) != std::string::npos)) {
        return option->get_name() + ": '" + value + "' has an empty item; " +
               "give the items with one '" + comma + "' between each two";
      }
    }
  }
  return "";
}

// Levenshtein distance: the edits (insert, delete, replace) from a to b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::function<std::string(const std::string&)>& flag_hint() {
  static std::function<std::string(const std::string&)> hint;
  return hint;
}

// "; did you mean --epochs?" for each unexpected flag within a few edits of
// one of `app`'s, as git and cargo suggest; the program's own hint first.
std::string suggestions(const CLI::App& app) {
  std::string text;
  for (const auto& arg : app.remaining()) {
    if (arg.rfind("--", 0) != 0) {
      continue;
    }
    const auto given = arg.substr(0, arg.find('='));
    const auto own = flag_hint() ? flag_hint()(given) : std::string();
    if (!own.empty()) {
      text += "; " + given + ": " + own;
      continue;
    }
    const auto best = nearest_flag(app, given);
    if (!best.empty()) {
      text += "; " + given + ": did you mean " + best + "?";
    }
  }
  return text;
}

// The physical cores among the CPUs this process may run on (its affinity
// mask, as taskset or a container's cpuset sets it): hyperthreads of one
// core count once, by the core and package ids Linux gives in sysfs. Where
// those cannot be read, the CPUs themselves.
int64_t physical_cores_available() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return std::max<int64_t>(1, at::get_num_threads());
  }
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) {
      continue;
    }
    const auto topology =
        "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core(topology + "core_id");
    std::ifstream package(topology + "physical_package_id");
    std::string core_id, package_id;
    if (!(core >> core_id) || !(package >> package_id)) {
      return std::max<int64_t>(1, CPU_COUNT(&mask)); // no topology: the CPUs
    }
    cores.insert({package_id, core_id});
  }
  return std::max<int64_t>(1, static_cast<int64_t>(cores.size()));
}

} // namespace

std::string settings_file_note(const std::string& message,
                               const SettingsSources& sources) {
  // Each flag the message names that the file set, where the message first
  // names it (a flag whose name goes on, --steps-per-x, is not --steps);
  // or names its value as the library does ("precision 'amp'").
  std::vector<std::pair<size_t, std::string>> named;
  for (const auto& [flag, source] : sources) {
    const auto value = message.find(" " + flag.substr(2) + " '");
    if (value != std::string::npos) {
      named.emplace_back(value + 1, source);
      continue;
    }
    for (auto at = message.find(flag); at != std::string::npos;
         at = message.find(flag, at + 1)) {
      const auto end = at + flag.size();
      if (end == message.size() ||
          !(std::isalnum(static_cast<unsigned char>(message[end])) ||
            message[end] == '-' || message[end] == '_')) {
        named.emplace_back(at, source);
        break;
      }
    }
  }
  if (named.empty()) {
    return "";
  }
  std::sort(named.begin(), named.end());
  std::string note = " (set by ";
  for (size_t i = 0; i < named.size(); ++i) {
    note.append(i == 0 ? "" : "; ").append(named[i].second);
  }
  return note + ")";
}

std::string shell_command(const std::vector<std::string>& args) {
  std::string line;
  for (const auto& arg : args) {
    const bool plain =
        !arg.empty() &&
        arg.find_first_not_of(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
            "0123456789_./=:,+-@%") == std::string::npos;
    std::string quoted = "'";
    for (const char c : arg) {
      quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    line += (line.empty() ? "" : " ") + (plain ? arg : quoted + "'");
  }
  return line;
}

std::string nearest_name(const std::vector<std::string>& names,
                         const std::string& given) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, given.size() / 3) + 1;
  for (const auto& name : names) {
    const auto distance = edit_distance(given, name);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  return best;
}

void set_flag_hint(std::function<std::string(const std::string& flag)> hint) {
  flag_hint() = std::move(hint);
}

std::string nearest_flag(const CLI::App& app, const std::string& given) {
  std::vector<std::string> flags;
  for (const auto* option : app.get_options()) {
    for (const auto& name : option->get_lnames()) {
      flags.push_back("--" + name);
    }
  }
  return nearest_name(flags, given);
}

int64_t use_threads(int64_t flag, std::string* source) {
  int64_t threads = flag;
  std::string from = "--threads";
  if (threads == 0) {
    if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
      char* end = nullptr;
      const long value = std::strtol(omp, &end, 10);
      TORCH_CHECK(end != omp && *end == '\0' && value >= 1 && value <= 4096,
                  "OMP_NUM_THREADS is '", omp,
                  "', not a thread count from 1 to 4096; set it to one, or "
                  "unset it and give --threads N.");
      threads = value;
      from = "OMP_NUM_THREADS";
    } else {
      threads = physical_cores_available();
      from = "cores";
    }
  }
  // Under `ulimit -v`, at::set_num_threads() waits forever for a pool
  // thread it could not start: the threads' room is checked first, as the
  // run's is later (lamp/platform/address_space.h).
  lamp::check_address_space(
      lamp::address_space(),
      lamp::address_space_needed(static_cast<int>(threads), 0),
      "a pool of " + std::to_string(threads) + " compute threads (" + from +
          ")");
  at::set_num_threads(static_cast<int>(threads));
  if (source != nullptr) {
    *source = from;
  }
  return threads;
}

std::string short_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

std::string exact_number(double value) {
  char text[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) {
      break;
    }
  }
  return text;
}

std::string perplexity_text(double loss) {
  const double perplexity = std::exp(loss);
  if (!std::isfinite(perplexity)) {
    return "inf";
  }
  char text[32];
  std::snprintf(text, sizeof(text), perplexity < 1e6 ? "%.2f" : "%.3g",
                perplexity);
  return text;
}

const std::vector<std::string>& precision_flag_values() {
  static const std::vector<std::string> values =
      lamp::precision_table().spellings();
  return values;
}

std::string version_line() {
  std::string line =
      "lamp " LAMP_VERSION ", LibTorch " + lamp::libtorch_version();
  const auto cuda = lamp::cuda_versions();
  if (!cuda.empty()) {
    line += ", " + cuda;
  }
  return line;
}

void add_version_flag(CLI::App& app, const std::string& program) {
  app.set_version_flag(
      "--version", [program] { return program + " " + version_line(); },
      "print the versions of lamp, LibTorch, CUDA and cuDNN and exit");
}

void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      // open() takes the lowest free descriptor: this one.
      const int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (opened != fd && opened >= 0) {
        ::close(opened); // /dev/null is missing a lower slot: nothing to do
      }
    }
  }
}

int parse_command_line(CLI::App& app, const std::string& program, int argc,
                       char** argv, const PythonConfigReader& python,
                       SettingsSources* set_by) {
  // Before any file of the program's is opened.
  open_standard_descriptors();
  read_integers_as_decimal(app);
  if (app.get_option_no_throw("--config") == nullptr) {
    app.add_option("--config")
        ->description(
            "a settings file: the run's flags as key = value lines (width = "
            "384; a switch: eval-train = true), which the command line's "
            "override" +
            std::string(python ? "; or a nanoGPT config/*.py file" : ""))
        ->type_name("FILE")
        ->check(non_empty_path("a settings file"));
  }
  SettingsSources local;
  SettingsSources& sources = set_by != nullptr ? *set_by : local;
  sources.clear();
  std::vector<std::string> notes;
  std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  try {
    args = with_config_settings(app, args, python, sources, notes);
  } catch (const ConfigFileError& e) {
    std::cerr << program << ": error: " << one_line(e.what()) << " (see "
              << program << " --help)" << std::endl;
    return kUsageError; // a settings file's
  }
  for (const auto& note : notes) {
    std::cerr << program << ": note: " << note << std::endl;
  }
  if (const auto empty = empty_list_item(app, args); !empty.empty()) {
    std::cerr << program << ": error: " << empty
              << settings_file_note(empty, sources) << " (see " << program
              << " --help)" << std::endl;
    return kUsageError;
  }
  const std::vector<std::string> added(
      args.begin() + std::min<ptrdiff_t>(std::max(argc - 1, 0),
                                         static_cast<ptrdiff_t>(args.size())),
      args.end());
  std::reverse(args.begin(), args.end()); // CLI11 takes them last first
  try {
    app.parse(args);
    // What the settings file gave, as flags: nanoGPT's names and train.py's
    // defaults become these (one rank says it).
    const char* rank = std::getenv("RANK");
    if (!sources.empty() && (rank == nullptr || std::string(rank) == "0")) {
      std::cout << program << ": --config "
                << app.get_option("--config")->as<std::string>() << " gives "
                << shell_command(added) << std::endl;
    }
    return -1;
  } catch (const CLI::Success& e) { // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // An unknown flag: the nearest known one, as a hint.
    const auto hint =
        dynamic_cast<const CLI::ExtrasError*>(&e) ? suggestions(app) : "";
    std::cerr << program << ": error: " << usage_words(one_line(e.what()))
              << hint << settings_file_note(e.what(), sources) << " (see "
              << program << " --help)" << std::endl;
    return kUsageError; // as argparse's
  }
}

torch::Device resolve_device(const std::string& name) {
  if (name.empty()) {
    return lamp::cuda_available() ? torch::Device(torch::kCUDA)
                                  : torch::Device(torch::kCPU);
  }
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(name);
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "--device '", name,
                "' is not a device; use cpu, cuda or cuda:N.");
  }
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "--device '", name,
              "': only cpu and cuda devices are supported.");
  TORCH_CHECK(
      !device.is_cpu() || !device.has_index() || device.index() == 0,
      "--device ", name,
      ": there is only one CPU device (LibTorch uses all cores through it); use --device cpu.");
  TORCH_CHECK(
      !device.is_cuda() || lamp::cuda_available(), "--device ", name,
      ": no CUDA GPU is available to this process (or this LibTorch was built without CUDA); use --device cpu.");
  if (device.is_cuda() && device.has_index()) {
    const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
    TORCH_CHECK(device.index() < gpus, "--device ", name,
                ": this process sees ", gpus,
                gpus == 1 ? " CUDA GPU" : " CUDA GPUs", ", cuda:0",
                gpus == 1 ? "" : " to cuda:" + std::to_string(gpus - 1),
                "; give one of them (CUDA_VISIBLE_DEVICES sets which GPUs "
                "the process sees).");
  }
  return device;
}

std::string error_message(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  return c10_error ? c10_error->what_without_backtrace() : error.what();
}

int guarded_main(const std::string& program, const std::function<int()>& body,
                 const SettingsSources& sources) {
  // The library's warnings (and LibTorch's) as one line each, in the
  // programs' own form, instead of c10's with a C++ source location.
  lamp::WarningSink warnings([&program](const std::string& message) {
    std::cout.flush();
    std::cerr << program << ": warning: " << message << std::endl;
  });
  std::string message;
  try {
    return body();
  } catch (const std::exception& e) {
    message = error_message(e);
  }
  // The note inside the sentence: "... or less (set by run.toml line 2
  // (batch-size = 99999))."
  const auto note = settings_file_note(message, sources);
  if (!note.empty() && message.back() == '.') {
    message.insert(message.size() - 1, note);
  } else {
    message += note;
  }
  std::cout.flush();
  std::cerr << program << ": error: " << message << std::endl;
  return kRuntimeError;
}

void print_out(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const int printed = std::vprintf(format, args);
  va_end(args);
  if (printed < 0 || std::fflush(stdout) != 0) {
    TORCH_CHECK(false, "cannot write to standard output (",
                std::strerror(errno),
                "): its reader has gone or its disk is full; stopping.");
  }
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t value = 0;
        if (!parse_integer(text, value)) {
          return not_an_integer(text);
        }
        if (value < lo || value > hi) {
          return text + " is out of range: give an integer in " + range;
        }
        return "";
      },
      "", kIntegerCheck);
}

CLI::Validator integer_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t value = 0;
        if (!parse_integer(text, value)) {
          return not_an_integer(text);
        }
        if (value < lo) {
          return text + " is out of range: give an integer of at least " +
                 std::to_string(lo);
        }
        return "";
      },
      "", kIntegerCheck);
}

// CLI11 converts an out-of-range or negative value for a uint64_t to a
// wrapped or saturated number without a word: check the text first.
CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool digits =
            !text.empty() && text.size() <= 20 &&
            text.find_first_not_of("0123456789") == std::string::npos;
        if (digits && (text.size() < 20 || text <= "18446744073709551615")) {
          return "";
        }
        return "'" + text + "' is not an integer in 0..18446744073709551615";
      },
      "", kIntegerCheck);
}

CLI::Validator real_in(double lo, double hi, bool lo_open, bool hi_open) {
  std::string range;
  if (hi == std::numeric_limits<double>::infinity()) {
    range = (lo_open ? "> " : ">= ") + short_number(lo);
  } else {
    range = (lo_open ? "(" : "[") + short_number(lo) + ", " + short_number(hi) +
            (hi_open ? ")" : "]");
  }
  return CLI::Validator(
      [lo, hi, lo_open, hi_open, range](std::string& text) -> std::string {
        double value = 0;
        if (!parse_real(text, value)) {
          return "'" + text + "' is not a finite number";
        }
        if (value < lo || (lo_open && value == lo) || value > hi ||
            (hi_open && value == hi)) {
          return text + " is out of range: give a number " +
                 (range[0] == '>' ? range : "in " + range);
        }
        return "";
      },
      "");
}

CLI::Validator positive_real() {
  return real_in(0.0, std::numeric_limits<double>::infinity(),
                 /*lo_open=*/true);
}

CLI::Validator non_negative_real() {
  return real_in(0.0, std::numeric_limits<double>::infinity());
}

CLI::Validator non_empty_path(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        return text.empty() ? "the path is empty; give " + what : "";
      },
      "");
}

} // namespace lamp_examples
