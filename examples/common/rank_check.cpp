#include "rank_check.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "run_flags.h"

namespace lamp_examples {
namespace {

// One spelling per number ("5e-2" and "0.05" are the same --lr); other text
// as it was given.
std::string canonical(const std::string& text) {
  if (text.empty()) {
    return text;
  }
  char* end = nullptr;
  errno = 0;
  const long long integer = std::strtoll(text.c_str(), &end, 10);
  if (*end == '\0' && errno == 0) {
    return std::to_string(integer);
  }
  errno = 0;
  const double real = std::strtod(text.c_str(), &end);
  if (*end == '\0' && errno == 0) {
    // The shortest spelling that reads back as the same double.
    char buffer[32];
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(buffer, sizeof buffer, "%.*g", digits, real);
      if (std::strtod(buffer, nullptr) == real) {
        break;
      }
    }
    return buffer;
  }
  return text;
}

} // namespace

std::vector<std::pair<std::string, std::string>> rank_flag_settings(
    const CLI::App& app) {
  static const std::set<std::string> per_rank = {
      "device",           "data", "log-json", "log-every", "no-progress",
      "report-precision", "help", "version"};
  static const std::set<std::string> only_whether_given = {
      "checkpoint", "resume", "init-from", "export-state-dict"};
  std::vector<std::pair<std::string, std::string>> settings;
  for (const auto* option : app.get_options()) {
    const auto& names = option->get_lnames();
    if (names.empty() || per_rank.count(names[0]) != 0) {
      continue;
    }
    std::string value;
    if (option->get_expected_min() == 0) { // a flag without a value
      value = option->count() != 0 ? "given" : "not given";
    } else if (option->count() == 0) {
      value = canonical(option->get_default_str());
      if (value.empty()) {
        value = "not given";
      }
    } else if (only_whether_given.count(names[0]) != 0) {
      value = "given";
    } else {
      for (const auto& result : option->results()) {
        value += (value.empty() ? "" : " ") + canonical(result);
      }
    }
    settings.emplace_back("--" + names[0], value);
  }
  return settings;
}

std::vector<std::pair<std::string, std::string>> run_flag_settings(
    const CLI::App& app, const ProgramConfig& config) {
  auto settings = rank_flag_settings(app);
  for (const auto& row : run_flags()) {
    const auto* option = app.get_option_no_throw(row.flag);
    if (row.stored == nullptr || !row.value || option == nullptr ||
        option->count() != 0) {
      continue; // not stored, or as typed
    }
    const auto value = row.value(config);
    std::string text = row.is_switch
                           ? (value.get<bool>() ? "given" : "not given")
                       : value.is_string() ? value.get<std::string>()
                                           : canonical(value.dump());
    for (auto& setting : settings) {
      if (setting.first == row.flag) {
        setting.second = text.empty() ? "not given" : text;
      }
    }
  }
  return settings;
}

void check_ranks_agree(
    lamp::distributed::ProcessGroup& group,
    const std::vector<std::pair<std::string, std::string>>& flags) {
  group.check_same(
      "their command-line flags", flags,
      "Start every rank with the same flags (torchrun passes one command line to all).");
}

} // namespace lamp_examples
