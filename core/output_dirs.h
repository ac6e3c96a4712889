// Creating the directories a run writes into, with a failure said as whose it is.
#pragma once
#include <string>

namespace mx {

// Whether errno `err` from creating or opening an output path means the path cannot exist as
// the configuration names it: a name too long (ENAMETOOLONG), a component that is a file
// (ENOTDIR, EEXIST), a loop of links (ELOOP). Bad input, exit 2; anything else (EIO, ENOSPC,
// EACCES, EROFS) is the storage's, exit 3.
bool is_config_path_errno(int err);

// Throws UserError or StorageError (as above) with `message`.
[[noreturn]] void throw_path_error(int err, const std::string& message);

// Where `path` lies against directory `dir`, both made absolute and resolved as far as they
// exist (links, "..", "."; the rest taken as written).
enum class PathPlace { kOutside, kSame, kInside };
PathPlace path_place(const std::string& path, const std::string& dir);

// Whether `name` names a file inside a directory and nothing else: not empty, at most 255
// bytes, not ".", no '/', '\\', NUL or "..". For names read from files (a checkpoint's
// manifest, a Hugging Face index) that are joined to a directory.
bool is_plain_file_name(const std::string& name);

// create_directories(dir); on failure throws as above: "<what> <dir>: <reason>".
void create_output_dirs(const std::string& dir, const std::string& what);

}  // namespace mx
