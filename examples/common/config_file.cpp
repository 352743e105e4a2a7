#include "config_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"

namespace lamp_examples {
namespace {

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) {
    return "";
  }
  const auto last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

// `line` without its `#` comment: a `#` inside quotes is text.
std::string without_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

bool is_name(const std::string& text, bool python) {
  if (text.empty() ||
      (python && std::isdigit(static_cast<unsigned char>(text[0])))) {
    return false;
  }
  return std::all_of(text.begin(), text.end(), [python](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
           (!python && c == '-');
  });
}

// A quoted string that is the whole of `text`: '...' (as written) or "..."
// (with \" \\ \n \t). False where `text` is not one.
bool unquote(const std::string& text, std::string& value) {
  if (text.size() < 2 || (text[0] != '"' && text[0] != '\'') ||
      text.back() != text[0]) {
    return false;
  }
  const char quote = text[0];
  value.clear();
  for (size_t i = 1; i + 1 < text.size(); ++i) {
    char c = text[i];
    if (c == quote) {
      return false; // it ends before the end: 'a' + 'b'
    }
    if (c == '\\' && i + 2 < text.size()) {
      const char next = text[++i];
      c = next == 'n' ? '\n' : next == 't' ? '\t' : next;
      if (quote == '\'' && next != '\'' && next != '\\') {
        value += '\\'; // Python keeps an unknown escape as written
        c = next;
      }
    }
    value += c;
  }
  return true;
}

// Python arithmetic over numbers: + - * / // % ** and parentheses, by
// precedence, in doubles (exact for the counts and rates a settings file
// holds: integers within 2^53). Fails (returns false) on anything else,
// and on an expression nested deeper than kMostDepth (parentheses, signs
// and exponents together), as Python refuses 200 nested parentheses: each
// level is a recursion, and a line of 200,000 '(' would overflow the stack.
class Arithmetic {
 public:
  explicit Arithmetic(const std::string& text) : text_(text) {}

  bool evaluate(double& result) {
    return sum(result) && (skip_space(), at_ == text_.size()) &&
           std::isfinite(result);
  }

 private:
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t')) {
      ++at_;
    }
  }
  bool take(const char* token) {
    skip_space();
    const std::string t(token);
    if (text_.compare(at_, t.size(), t) != 0) {
      return false;
    }
    // `*` is not the first half of `**`, nor `/` of `//`.
    if (t.size() == 1 && at_ + 1 < text_.size() && text_[at_ + 1] == t[0] &&
        (t[0] == '*' || t[0] == '/')) {
      return false;
    }
    at_ += t.size();
    return true;
  }
  bool sum(double& n) {
    if (!product(n)) {
      return false;
    }
    for (;;) {
      const bool plus = take("+");
      if (!plus && !take("-")) {
        return true;
      }
      double rhs = 0;
      if (!product(rhs)) {
        return false;
      }
      n = plus ? n + rhs : n - rhs;
    }
  }
  bool product(double& n) {
    if (!unary(n)) {
      return false;
    }
    for (;;) {
      // `//` before `/`; `%` is Python's, the sign of the divisor.
      const char op = take("//")  ? 'f'
                      : take("*") ? '*'
                      : take("/") ? '/'
                      : take("%") ? '%'
                                  : 0;
      if (op == 0) {
        return true;
      }
      double rhs = 0;
      if (!unary(rhs) || (op != '*' && rhs == 0)) {
        return false; // Python raises ZeroDivisionError
      }
      n = op == 'f'   ? std::floor(n / rhs)
          : op == '*' ? n * rhs
          : op == '/' ? n / rhs
                      : n - rhs * std::floor(n / rhs);
    }
  }
  bool unary(double& n) {
    // Every recursion (a parenthesis, a sign, an exponent) passes here.
    if (depth_ >= kMostDepth) {
      return false;
    }
    ++depth_;
    const bool evaluated = signed_power(n);
    --depth_;
    return evaluated;
  }
  bool signed_power(double& n) {
    if (take("-")) {
      if (!unary(n)) {
        return false;
      }
      n = -n;
      return true;
    }
    if (take("+")) {
      return unary(n);
    }
    return power(n);
  }
  bool power(double& n) {
    if (!atom(n)) {
      return false;
    }
    if (take("**")) {
      double exponent = 0;
      if (!unary(exponent)) {
        return false;
      }
      n = std::pow(n, exponent);
    }
    return true;
  }
  bool atom(double& n) {
    if (take("(")) {
      return sum(n) && take(")");
    }
    skip_space();
    const size_t start = at_;
    std::string digits;
    bool seen_digit = false;
    while (at_ < text_.size()) {
      const char c = text_[at_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        seen_digit = true;
      } else if (c == '.' || ((c == 'e' || c == 'E') && seen_digit)) {
        if ((c == 'e' || c == 'E') && at_ + 1 < text_.size() &&
            (text_[at_ + 1] == '+' || text_[at_ + 1] == '-')) {
          digits += c;
          ++at_;
          digits += text_[at_++];
          continue;
        }
      } else if (c != '_') {
        break;
      }
      if (c != '_') {
        digits += c;
      }
      ++at_;
    }
    if (!seen_digit || at_ == start) {
      return false;
    }
    char* end = nullptr;
    n = std::strtod(digits.c_str(), &end);
    return end == digits.c_str() + digits.size();
  }

  static constexpr int kMostDepth = 200;
  const std::string& text_;
  size_t at_ = 0;
  int depth_ = 0;
};

// An integral float as an integer too ("1e5" -> "100000"): a count written
// as a float (max_iters = 1e5) is one in Python's comparisons, and the flags
// read "100000" as an integer and as a real alike.
std::string number_text(double n) {
  if (n == std::floor(n) && std::fabs(n) < 9007199254740992.0) { // 2^53
    return std::to_string(static_cast<long long>(n));
  }
  return exact_number(n);
}

[[noreturn]] void refuse(const std::string& message) {
  throw ConfigFileError(message);
}

// A line of lamp's own settings file, as a setting; false for a blank one.
bool read_toml_line(const std::string& path, int number, const std::string& raw,
                    ConfigSetting& setting) {
  const auto line = trim(without_comment(raw));
  if (line.empty()) {
    return false;
  }
  const auto at = path + " line " + std::to_string(number) + ": ";
  if (line[0] == '[') {
    refuse(at +
           "tables ([name]) are not read: write the flags as key = "
           "value lines, without sections.");
  }
  const auto equals = line.find('=');
  if (equals == std::string::npos) {
    refuse(at + "'" + line +
           "' is not a setting: write key = value, as in "
           "width = 384.");
  }
  setting.key = trim(line.substr(0, equals));
  auto value = trim(line.substr(equals + 1));
  setting.line = number;
  if (!is_name(setting.key, false)) {
    refuse(at + "'" + setting.key + "' is not a flag's name: write the long " +
           "flag without its dashes, as in eval-every = 250.");
  }
  if (value.empty()) {
    refuse(at + setting.key + " has no value: write " + setting.key +
           " = VALUE (a string in quotes for an empty one: \"\").");
  }
  if (value[0] == '[' || value[0] == '{') {
    refuse(at + setting.key + ": arrays and tables are not read; give a " +
           "list as one string, as on the command line: " + setting.key +
           " = \"1,2,3\".");
  }
  if (value[0] == '"' || value[0] == '\'') {
    setting.quoted = true;
    if (!unquote(value, setting.value)) {
      refuse(at + setting.key + ": the string " + value +
             " is not closed, or text follows it.");
    }
  } else {
    setting.value = value;
  }
  return true;
}

// A line of a Python settings file, as a setting; false for a blank line or
// an import.
bool read_python_line(const std::string& path, int number,
                      const std::string& raw, ConfigSetting& setting) {
  const auto line = trim(without_comment(raw));
  if (line.empty() || line.rfind("import ", 0) == 0 ||
      line.rfind("from ", 0) == 0) {
    return false;
  }
  const auto equals = line.find('=');
  const auto key =
      equals == std::string::npos ? "" : trim(line.substr(0, equals));
  if (equals == std::string::npos || equals + 1 >= line.size() ||
      line[equals + 1] == '=' || !is_name(key, true)) {
    refuse(path + " line " + std::to_string(number) + ": '" + line +
           "' is not an assignment: a Python settings file holds lines "
           "such as n_layer = 6 (and imports).");
  }
  setting.key = key;
  setting.line = number;
  const auto expression = trim(line.substr(equals + 1));
  setting.evaluated =
      evaluate_python_literal(expression, setting.value, setting.none);
  if (!setting.evaluated) {
    setting.value = expression;
  }
  setting.quoted =
      setting.evaluated && (expression[0] == '"' || expression[0] == '\'');
  return true;
}

} // namespace

std::string ConfigFile::where(const ConfigSetting& setting) const {
  auto value = setting.value;
  if (setting.none) {
    value = "None";
  } else if (setting.quoted) {
    value = "'" + value + "'";
  } else if (python && setting.evaluated &&
             (value == "true" || value == "false")) {
    value = value == "true" ? "True" : "False";
  }
  // A message quotes a line, not a page: a damaged file's line may be long.
  constexpr size_t kMostQuoted = 80;
  if (value.size() > kMostQuoted) {
    value = value.substr(0, kMostQuoted - 3) + "...";
  }
  return path + " line " + std::to_string(setting.line) + " (" + setting.key +
         " = " + value + ")";
}

bool evaluate_python_literal(const std::string& expression, std::string& text,
                             bool& none) {
  const auto e = trim(expression);
  none = false;
  if (e == "True" || e == "False") {
    text = e == "True" ? "true" : "false";
    return true;
  }
  if (e == "None") {
    none = true;
    text.clear();
    return true;
  }
  if (!e.empty() && (e[0] == '"' || e[0] == '\'')) {
    return e.rfind("\"\"\"", 0) != 0 && e.rfind("'''", 0) != 0 &&
           unquote(e, text);
  }
  double number = 0;
  Arithmetic arithmetic(e);
  if (!arithmetic.evaluate(number)) {
    return false;
  }
  text = number_text(number);
  return true;
}

ConfigFile read_config_file(const std::string& path) {
  ConfigFile file;
  file.path = path;
  const auto extension = path.size() >= 3 ? path.substr(path.size() - 3) : "";
  file.python = extension == ".py";
  std::ifstream in(path);
  if (!in) {
    refuse("--config " + path +
           ": no such file, or it cannot be read: give the path of a "
           "settings file (key = value lines)");
  }
  std::string raw;
  int number = 0;
  std::string docstring; // the quotes that end the one being skipped
  while (std::getline(in, raw)) {
    ++number;
    // A Python file's docstrings ("""...""" or '''...'''), on one line or
    // several.
    const auto text = trim(raw);
    if (!docstring.empty()) {
      if (text.find(docstring) != std::string::npos) {
        docstring.clear();
      }
      continue;
    }
    if (file.python &&
        (text.rfind("\"\"\"", 0) == 0 || text.rfind("'''", 0) == 0)) {
      if (text.find(text.substr(0, 3), 3) == std::string::npos) {
        docstring = text.substr(0, 3);
      }
      continue;
    }
    ConfigSetting setting;
    const bool read = file.python ? read_python_line(path, number, raw, setting)
                                  : read_toml_line(path, number, raw, setting);
    if (!read) {
      continue;
    }
    auto same = std::find_if(
        file.settings.begin(), file.settings.end(),
        [&](const ConfigSetting& s) { return s.key == setting.key; });
    if (same == file.settings.end()) {
      file.settings.push_back(setting);
    } else if (file.python) {
      *same = setting; // Python: the last assignment holds
    } else {
      refuse(path + " line " + std::to_string(number) + ": " + setting.key +
             " is set again (first on line " + std::to_string(same->line) +
             "): keep one.");
    }
  }
  if (in.bad()) {
    refuse("--config " + path + ": reading it failed after line " +
           std::to_string(number));
  }
  return file;
}

std::vector<std::string> with_config_settings(
    const CLI::App& app, const std::vector<std::string>& args,
    const PythonConfigReader& python, SettingsSources& sources,
    std::vector<std::string>& notes) {
  std::string path;
  int configs = 0;
  // What the command line gives, by option (any of its names).
  std::map<const CLI::Option*, std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& arg = args[i];
    if (arg == "-h" || arg == "--help" || arg == "--version") {
      return args;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      continue;
    }
    const auto equals = arg.find('=');
    const auto name = arg.substr(0, equals);
    const auto* option = app.get_option_no_throw(name);
    std::string value;
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (option != nullptr && option->get_expected_min() > 0 &&
               i + 1 < args.size()) {
      value = args[++i];
    }
    if (name == "--config") {
      ++configs;
      path = value;
    } else if (option != nullptr) {
      given[option] = value;
    }
  }
  if (configs == 0 || path.empty()) {
    return args; // CLI11 says what is missing
  }
  if (configs > 1) {
    refuse("--config is given " + std::to_string(configs) +
           " times: give one settings file (flags on the command line "
           "override its settings).");
  }
  const auto file = read_config_file(path);
  std::vector<ConfigFlag> flags;
  if (file.python) {
    if (!python) {
      refuse("--config " + path +
             ": this program reads settings files of key = value lines "
             "(TOML's form), not Python; nanoGPT's config files are "
             "train_gpt's.");
    }
    const GivenFlag given_flag =
        [&](const std::string& flag) -> const std::string* {
      const auto* option = app.get_option_no_throw(flag);
      const auto found = given.find(option);
      return found == given.end() ? nullptr : &found->second;
    };
    flags = python(file, given_flag, notes);
  } else {
    for (const auto& setting : file.settings) {
      auto flag = "--" + setting.key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      if (flag == "--config" || flag == "--help" || flag == "--version") {
        refuse(file.where(setting) + ": " + flag +
               " belongs on the command line, not in a settings file.");
      }
      flags.push_back({flag, setting.value, file.where(setting)});
    }
  }
  auto expanded = args;
  std::map<const CLI::Option*, std::string> set_by;
  for (const auto& flag : flags) {
    const auto* option = app.get_option_no_throw(flag.flag);
    if (option == nullptr) {
      const auto nearest = nearest_flag(app, flag.flag);
      refuse(flag.source + ": " + flag.flag + " is not a flag of this program" +
             (nearest.empty() ? "" : "; did you mean " + nearest + "?"));
    }
    if (given.count(option) != 0) {
      continue; // the command line's wins
    }
    // As over a flag the file sets itself, over one the command line's
    // flags exclude: --resume over a file's --init-from, the run the file
    // started continued.
    const CLI::Option* excluded_by = nullptr;
    for (const auto* excluding : option->get_excludes()) {
      if (given.count(excluding) != 0) {
        excluded_by = excluding;
      }
    }
    if (excluded_by != nullptr) {
      notes.push_back(flag.source + ": left out, as the command line's " +
                      excluded_by->get_name() + " excludes " + flag.flag + ".");
      continue;
    }
    const auto earlier = set_by.find(option);
    if (earlier != set_by.end()) {
      refuse(flag.source + " and " + earlier->second + " both set " +
             flag.flag + ": keep one.");
    }
    set_by[option] = flag.source;
    if (option->get_expected_min() == 0) {
      if (flag.value != "true" && flag.value != "false") {
        refuse(flag.source + ": " + flag.flag +
               " is a switch: give true (or false, the same as leaving it "
               "out).");
      }
      if (flag.value == "true") {
        expanded.push_back(flag.flag);
        sources[flag.flag] = flag.source;
      }
      continue;
    }
    expanded.push_back(flag.flag + "=" + flag.value);
    sources[flag.flag] = flag.source;
  }
  return expanded;
}

} // namespace lamp_examples
