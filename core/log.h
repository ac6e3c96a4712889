// Logging: info lines to stderr, so stdout stays for command results (`loss 1.23`, JSON).
#pragma once
#include <string>

#include "core/error.h"

namespace mx {

enum class LogLevel { kQuiet = 0, kInfo = 1, kDebug = 2 };
void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, const std::string& line);
void warn(const std::string& line);  // "warning: ..." on stderr, always shown

template <typename... Args>
void info(const Args&... args) {
  if (log_level() >= LogLevel::kInfo) log_line(LogLevel::kInfo, str(args...));
}
// Several lines (a table): each printed as its own info line, control bytes escaped within it.
void info_lines(const std::string& text);

// Human-readable sizes and durations for progress lines.
std::string format_bytes(double bytes);
std::string format_duration(double seconds);
std::string format_count(double n);  // 12.3k, 4.5M

}  // namespace mx
