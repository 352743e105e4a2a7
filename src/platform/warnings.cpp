#include "lamp/platform/warnings.h"

#include <c10/util/Exception.h>

#include <utility>

#include "platform/compat.h"

namespace lamp {

WarningSink::WarningSink(std::function<void(const std::string& message)> sink)
    : handler_(detail::make_warning_handler(std::move(sink))),
      previous_(detail::warning_handler()) {
  detail::set_warning_handler(handler_.get());
}

WarningSink::~WarningSink() {
  detail::set_warning_handler(previous_);
}

} // namespace lamp
