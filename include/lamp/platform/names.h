#pragma once

/// \file
/// One table of names per enum-like choice (precision modes, CUDA-graph
/// modes, optimizer implementations, schedules, optimizer names), read by
/// parsing, printing, error messages and the programs' flag checks alike, so
/// that a name is written once.

#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace lamp {

/// The names of an enum-like choice.
///
/// Each value has one canonical name, the first entry with that value, which
/// name() returns; later entries with the same value are aliases that
/// parse() accepts too. Messages list the canonical names in table order,
/// each alias in parentheses after its value's name:
///
/// \code
/// const NameTable<Schedule> table("learning-rate schedule", "schedules",
///     {{"constant", Schedule::kConstant}, {"cosine", Schedule::kCosine}});
/// table.parse("cosine");  // Schedule::kCosine
/// table.parse("linear");  // throws: "lamp: unknown learning-rate schedule
///                         // 'linear'; valid schedules are constant and
///                         // cosine."
/// \endcode
template <typename T>
class NameTable {
 public:
  /// One spelling of a value.
  struct Entry {
    std::string name; ///< the spelling
    T value;          ///< the value it stands for
  };

  /// `what` names one choice in messages ("precision"), `plural` the list
  /// ("precisions").
  NameTable(std::string what, std::string plural,
            std::initializer_list<Entry> entries)
      : what_(std::move(what)), plural_(std::move(plural)), entries_(entries) {
    for (const auto& entry : entries_) {
      if (find_name(entry.value) == &entry.name) {
        names_.push_back(entry.name);
      }
    }
  }

  /// The canonical name of `value`; a value missing from the table is an
  /// internal error.
  const std::string& name(T value) const {
    const auto* name = find_name(value);
    TORCH_INTERNAL_ASSERT(name != nullptr, "lamp: a ", what_,
                          " value is missing from its name table.");
    return *name;
  }

  /// The value `text` names (canonical name or alias). Anything else throws
  /// c10::Error: "lamp: unknown <what> '<text>'; valid <plural> are <list>."
  T parse(const std::string& text) const {
    for (const auto& entry : entries_) {
      if (entry.name == text) {
        return entry.value;
      }
    }
    TORCH_CHECK(false, "lamp: unknown ", what_, " '", text, "'; valid ",
                plural_, " are ", choices(), ".");
  }

  /// The canonical names, in table order.
  const std::vector<std::string>& names() const { return names_; }

  /// Every spelling parse() accepts, aliases included, in table order.
  std::vector<std::string> spellings() const {
    std::vector<std::string> all;
    for (const auto& entry : entries_) {
      all.push_back(entry.name);
    }
    return all;
  }

  /// The canonical names for a sentence, aliases in parentheses:
  /// "fp32, amp, half (or fp16) and bf16".
  std::string choices() const {
    std::string text;
    for (size_t i = 0; i < names_.size(); ++i) {
      if (i > 0) {
        text += i + 1 == names_.size() ? " and " : ", ";
      }
      text += names_[i];
      const T value = parse(names_[i]);
      std::string aliases;
      for (const auto& entry : entries_) {
        if (entry.value == value && entry.name != names_[i]) {
          aliases += (aliases.empty() ? "" : " or ") + entry.name;
        }
      }
      if (!aliases.empty()) {
        text += " (or " + aliases + ")";
      }
    }
    return text;
  }

 private:
  const std::string* find_name(T value) const {
    for (const auto& entry : entries_) {
      if (entry.value == value) {
        return &entry.name;
      }
    }
    return nullptr;
  }

  std::string what_;
  std::string plural_;
  std::vector<Entry> entries_;
  std::vector<std::string> names_;
};

} // namespace lamp
