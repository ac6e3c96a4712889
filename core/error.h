// Errors that reach the user. A UserError is bad input (config, flags, data, checkpoints):
// the CLI prints one `error:` line and exits 2. A StorageError is a failed read or write of
// storage that was itself well formed: exit 3. Anything else is a bug in mxtrain.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mx {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct StorageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// str("a", 1, "b") -> "a1b": message building without <format> (g++ 12 lacks it).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// The longest prefix of `s` of at most `bytes` bytes that does not end inside a UTF-8
// character (a message cut there would not be valid text).
inline std::string utf8_prefix(const std::string& s, size_t bytes) {
  if (s.size() <= bytes) return s;
  size_t cut = bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

// `s` in at most `max_bytes` bytes: itself, or its start (cut on a UTF-8 boundary) and
// "... (N bytes)". How a value or message of any size is shown (a 5 MB bad value echoed whole
// made a 5 MB error line and SageMaker failure file).
inline std::string shortened(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  const std::string suffix = str("... (", s.size(), " bytes)");
  return utf8_prefix(s, max_bytes > suffix.size() ? max_bytes - suffix.size() : 0) + suffix;
}

// An error message as the one line it must be: line breaks and other control bytes (a
// `--set` value or a hyperparameter holding a newline, a file name with one) become \n, \r,
// \t or \xHH, so a reader of stderr or of SageMaker's failure file sees one line.
inline std::string one_line(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace mx

// Bad input: throws UserError with the message built from the remaining arguments.
#define MX_REQUIRE(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) throw ::mx::UserError(::mx::str(__VA_ARGS__)); \
  } while (0)

// Internal invariant: a failure here is a bug in mxtrain, not bad input.
#define MX_ASSERT(cond, ...)                                                        \
  do {                                                                              \
    if (!(cond))                                                                    \
      throw std::logic_error(::mx::str("internal error at ", __FILE__, ":", __LINE__, \
                                       ": ", #cond, " ", ##__VA_ARGS__));            \
  } while (0)
