#pragma once

// Command-line conventions shared by lamp's programs (train_cifar10,
// train_mnist, train_step_demo, lamp_bench): argparse's exit codes and
// one-line messages, --version, and validators whose messages read well.
//
//   usage errors   one line "PROGRAM: error: ..." on stderr, exit 2
//   runtime errors one line "PROGRAM: error: ..." on stderr, exit 1
//   --help         the flags with their defaults on stdout, exit 0
//   --version      lamp's, LibTorch's (and CUDA's, cuDNN's) versions, exit 0

#include <torch/types.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "config_file.h"

namespace lamp_examples {

/// The exit status of a usage error (a bad flag or value), as argparse's.
constexpr int kUsageError = 2;
/// The exit status of an error while running.
constexpr int kRuntimeError = 1;

/// A number as printf's %g: "1e-05", "0.05", "65536" (not "0.000010" or
/// 309 digits of DBL_MAX).
std::string short_number(double value);

/// A double as the shortest text that reads back as the same double
/// ("0.2", not "0.20000000000000001"): for settings stored as text.
std::string exact_number(double value);

/// Sets LibTorch's intra-op threads and returns how many: `flag` (a
/// --threads value) where it is not 0, else OMP_NUM_THREADS where it is set
/// (refused unless a count from 1 to 4096), else the physical cores among
/// the CPUs this process may run on (its affinity mask; hyperthreads of a
/// core count once). `source` (optional) gets where the number came from:
/// "--threads", "OMP_NUM_THREADS" or "cores".
int64_t use_threads(int64_t flag, std::string* source = nullptr);

/// The perplexity exp(`loss`) of a mean loss per token, readable at any
/// size: "4.35" below a million, "2.69e+43" above, "inf" where exp
/// overflows or the loss is not finite.
std::string perplexity_text(double loss);

/// The spellings --precision accepts: lamp::precision_names() and "fp16"
/// (the same as "half").
const std::vector<std::string>& precision_flag_values();

/// "lamp 0.1.0, LibTorch 2.11.0, CUDA 13.0, cuDNN 9.19.0" (CUDA and cuDNN
/// only where this LibTorch has them; Debian's LibTorch adds its package:
/// "LibTorch 1.13.0 (Debian package libtorch-dev 1.13.1+dfsg-4)"), for
/// --version.
std::string version_line();

/// Adds --version (prints "PROGRAM " + version_line() and exits 0).
void add_version_flag(CLI::App& app, const std::string& program);

/// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed, so that
/// a program started with stdout closed (`prog >&-`) does not open its log
/// or results file as descriptor 1 and then print its console lines into
/// it.
void open_standard_descriptors();

/// `args` as one shell command line, each argument quoted where the shell
/// would split or expand it ('a b' -> "'a b'").
std::string shell_command(const std::vector<std::string>& args);

/// The one of `names` nearest to `given` in edits (insertions, deletions,
/// replacements), within about a third of its length; else "".
std::string nearest_name(const std::vector<std::string>& names,
                         const std::string& given);

/// The flag of `app` nearest to `given` ("--epoch" -> "--epochs"): within
/// about a third of its length in edits, else "".
std::string nearest_flag(const CLI::App& app, const std::string& given);

/// A program's own hint for an unknown flag ("--max_iters" -> "nanoGPT's
/// max_iters is --steps ..."), given instead of nearest_flag()'s where it
/// returns one: a name from another tool is matched by meaning, which
/// spelling misses (--max_iters is not --max-steps). Process-wide; set
/// before parse_command_line().
void set_flag_hint(std::function<std::string(const std::string& flag)> hint);

/// Parses the command line (after open_standard_descriptors()), with
/// --config FILE: the flags a settings file sets, where the command line
/// does not give them (common/config_file.h; `python` reads a *.py file,
/// where the program takes one). Every flag
/// checked by integer_in(), integer_at_least() or unsigned_integer() is read
/// as a decimal number: "010" is 10 and "08" is 8 (CLI11 alone would read
/// "010" as octal 8 and refuse "08"); an integer flag without one of those
/// checks is a programming error, thrown before parsing. Returns -1 when the
/// program should go on; otherwise the exit status: 0 after --help or
/// --version, kUsageError after a usage error, which is printed as one line
/// on stderr:
/// "PROGRAM: error: --epochs: 'abc' is not an integer (see PROGRAM --help)".
/// `sources`, where given, gets where the settings file set each flag.
int parse_command_line(CLI::App& app, const std::string& program, int argc,
                       char** argv, const PythonConfigReader& python = {},
                       SettingsSources* sources = nullptr);

/// " (set by SOURCE)" for the flags `message` names that a settings file
/// set, in the order the message names them ("; " between two), or "":
/// an error about a flag's value, found after parsing ("--warmup-steps
/// 100 is not shorter than --steps 40"), says which line gave it.
std::string settings_file_note(const std::string& message,
                               const SettingsSources& sources);

/// The device named by --device: "" is cuda when a GPU is available, else
/// cpu; otherwise cpu, cuda or cuda:N, each checked (a clear error for
/// "tpu", "cpu:1", cuda without a GPU, or cuda:N beyond the GPUs this
/// process sees).
torch::Device resolve_device(const std::string& name);

/// Runs the program's body: a c10::Error or std::exception is printed as
/// "PROGRAM: error: ..." and gives kRuntimeError; where the message names a
/// flag that a settings file set (`sources`), the line that set it follows
/// (settings_file_note()).
int guarded_main(const std::string& program, const std::function<int()>& body,
                 const SettingsSources& sources = {});

/// An exception's message as guarded_main() prints it (a c10::Error's
/// without its backtrace).
std::string error_message(const std::exception& error);

/// printf to stdout, then fflush: throws c10::Error naming standard output
/// and the system's reason when either fails (a closed pipe, EPIPE, with
/// SIGPIPE ignored; a full disk; /dev/full), so that a program whose output
/// is gone stops instead of running on unseen.
void print_out(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// Validators with readable messages: the text is checked as a number of
/// the right kind first ("'abc' is not an integer"), then the range, written
/// as people write it ("give an integer in 1..1000000"). They add nothing to
/// --help's type column ("INT=30"): say the range in the option's help.
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator integer_at_least(int64_t lo);
CLI::Validator unsigned_integer(); ///< 0..2^64-1, for uint64_t options
/// A finite real number in [lo, hi]; `lo_open` excludes lo (for "> 0"),
/// `hi_open` excludes hi (for Adam's betas, in [0, 1)).
CLI::Validator real_in(double lo, double hi, bool lo_open = false,
                       bool hi_open = false);
CLI::Validator positive_real();
CLI::Validator non_negative_real();

/// Refuses an empty path ("--checkpoint ''" would otherwise write nothing,
/// or resume nothing, without a word): "the path is empty; give " + `what`.
CLI::Validator non_empty_path(const std::string& what);

} // namespace lamp_examples
