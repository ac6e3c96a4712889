#include "core/output_dirs.h"

#include <cerrno>
#include <filesystem>
#include <iterator>
#include <system_error>

#include "core/error.h"

namespace mx {

bool is_config_path_errno(int err) {
  return err == ENAMETOOLONG || err == ENOTDIR || err == EEXIST || err == ELOOP;
}

void throw_path_error(int err, const std::string& message) {
  if (is_config_path_errno(err)) throw UserError(message);
  throw StorageError(message);
}

PathPlace path_place(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (p == d) return PathPlace::kSame;
  // (a trailing separator is an empty last element: "/a/b/" is "/a/b")
  auto d_end = d.end();
  if (d_end != d.begin() && std::prev(d_end)->empty()) --d_end;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d_end; ++di, ++pi)
    if (pi == p.end() || *pi != *di) return PathPlace::kOutside;
  for (; pi != p.end(); ++pi)
    if (!pi->empty()) return PathPlace::kInside;
  return PathPlace::kSame;
}

void create_output_dirs(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // (std::generic_category holds errno values: libstdc++ reports them so)
  if (ec) throw_path_error(ec.value(), str(what, " ", dir, ": ", ec.message()));
}

bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name.find("..") != std::string::npos)
    return false;
  for (char c : name)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

}  // namespace mx
