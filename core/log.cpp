#include "core/log.h"

#include <cmath>
#include <cstdio>

namespace mx {

static LogLevel g_level = LogLevel::kInfo;

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

// Each message is one line on stderr: a path or value holding a newline or other control
// byte (a file name, a --set value) is escaped as in error lines (one_line), so it can neither
// split the line nor move the terminal's cursor.
void log_line(LogLevel level, const std::string& line) {
  if (g_level < level) return;
  std::fprintf(stderr, "%s\n", one_line(line).c_str());
  std::fflush(stderr);
}

void info_lines(const std::string& text) {
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    log_line(LogLevel::kInfo, text.substr(b, e - b));
    b = e + 1;
  }
}

void warn(const std::string& line) {
  std::fprintf(stderr, "warning: %s\n", one_line(line).c_str());
  std::fflush(stderr);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace mx
