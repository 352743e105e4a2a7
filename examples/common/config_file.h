#pragma once

// Settings files for lamp's programs (--config FILE): the flags of a run
// written down once, as nanoGPT's config/*.py files hold its recipes.
//
//   # runs/small.toml: any long flag, by its name, without the dashes
//   layers = 4
//   width = 256
//   precision = "amp-bf16"
//   eval-train = true        # a switch: true gives it, false leaves it out
//
// A flag given on the command line wins over the file's, as nanoGPT's
// `--key=value` wins over its config file. A file named *.py is read as
// Python assignments (`n_embd = 384  # comment`, `'strings'`, True/False,
// numbers and their arithmetic; `import` lines and docstrings skipped), for
// a program that knows what such a file's names mean (train_gpt: nanoGPT's).

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace lamp_examples {

/// A settings file that cannot be used: a usage error (exit 2), its message
/// naming the file, the line and the fix.
class ConfigFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One `key = value` line of a settings file.
struct ConfigSetting {
  std::string key;   ///< as written: "eval-every", "n_embd"
  std::string value; ///< "384", "0.001", "true", "data/x" (quotes removed)
  /// false: a Python expression the reader does not evaluate, kept as
  /// written (`'ft-' + str(time.time())`), an error only where it is used.
  bool evaluated = true;
  bool none = false;   ///< Python's None
  bool quoted = false; ///< written as a string in quotes
  int line = 0;
};

/// A settings file as read: its `key = value` lines in order, each key once.
struct ConfigFile {
  std::string path;
  bool python = false; ///< a *.py file: Python assignments
  std::vector<ConfigSetting> settings;

  /// "config/train_shakespeare_char.py line 12 (n_embd = 384)".
  std::string where(const ConfigSetting& setting) const;
};

/// Reads `path`: a *.py file as Python assignments, any other as lamp's
/// `key = value` lines (TOML's form for them: `#` comments, strings in
/// double or single quotes, bare numbers, words and paths, true and false).
/// Throws ConfigFileError naming the file and line for anything else (a
/// missing file, a line that is not an assignment, a key given twice, a
/// TOML table or array).
ConfigFile read_config_file(const std::string& path);

/// Evaluates a Python literal as a settings file writes one: a number
/// ("6e-4", "1_000", "5 * 8", "(12 + 4) // 2"; an integral value is written
/// as an integer, "1e5" as "100000"), a string in quotes, True, False or
/// None. Sets `text` to the value's text ("40", "0.0006", "true") and
/// returns true; false for anything else (names, calls, lists, 1 / 0).
bool evaluate_python_literal(const std::string& expression, std::string& text,
                             bool& none);

/// A flag a settings file sets, and where from.
struct ConfigFlag {
  std::string flag;   ///< "--width"
  std::string value;  ///< "384"; a switch's "true" or "false"
  std::string source; ///< "run.toml line 3 (width = 384)"
};

/// The text the command line gave `flag` (by any of its names; "" for a
/// switch), or nullptr where it did not give it.
using GivenFlag = std::function<const std::string*(const std::string& flag)>;

/// Turns a Python settings file into the program's flags (train_gpt:
/// nanoGPT's config files); lines for the user (what is not carried over)
/// go on `notes`. Throws ConfigFileError for a setting it cannot take.
using PythonConfigReader = std::function<std::vector<ConfigFlag>(
    const ConfigFile& file, const GivenFlag& given,
    std::vector<std::string>& notes)>;

/// Where a settings file set each flag it set: "--width" -> "run.toml line
/// 3 (width = 384)".
using SettingsSources = std::map<std::string, std::string>;

/// `args` (the command line after the program's name) with the settings of
/// its --config file added as flags, after the command line's own, except
/// those the command line gives (by any of the flag's names). Without
/// --config, or with --help or --version, `args` as they are. `sources`
/// gets each added flag's source line, `notes` what a Python reader says.
/// A *.py file without `python` is refused, as is a key that names no flag
/// of `app` (with the nearest one), a switch's value other than true or
/// false, and --config given twice.
std::vector<std::string> with_config_settings(
    const CLI::App& app, const std::vector<std::string>& args,
    const PythonConfigReader& python, SettingsSources& sources,
    std::vector<std::string>& notes);

} // namespace lamp_examples
