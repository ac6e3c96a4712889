#include "core/output_dirs.h"

#include <cerrno>
#include <filesystem>
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

void create_output_dirs(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // (std::generic_category holds errno values: libstdc++ reports them so)
  if (ec) throw_path_error(ec.value(), str(what, " ", dir, ": ", ec.message()));
}

}  // namespace mx
