// Subcommands register themselves on the CLI11 app; the chosen one's action runs after parsing.
#pragma once
#include <CLI/CLI.hpp>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/output_dirs.h"

namespace mx::cli {

using Action = std::function<int()>;  // returns the exit code

void add_train(CLI::App& app, Action& action);
void add_debug(CLI::App& app, Action& action);
void add_ckpt(CLI::App& app, Action& action);
void add_generate(CLI::App& app, Action& action);
void add_bench(CLI::App& app, Action& action);
void add_numerics(CLI::App& app, Action& action);
void add_plan(CLI::App& app, Action& action);
void add_sweep(CLI::App& app, Action& action);
void add_sagemaker(CLI::App& app, Action& action);

// An output path that names an input file (the same path, another spelling of it, a link to
// it) would be overwritten by the output before anything checks it: one error line instead.
inline void require_distinct_output(const std::string& out, const char* out_flag,
                                    const std::string& in, const char* in_flag) {
  std::error_code ec;
  MX_REQUIRE(!std::filesystem::equivalent(out, in, ec), out_flag, " ", out, " is the ", in_flag,
             " file: the output would overwrite its input");
}

// The directory of an output file is created once the inputs are checked, before the long work
// or the write (as export-hf and run.metrics do): a --out under a directory not made yet failed
// only after the work, as a storage failure (exit 3). One that cannot be created is that storage
// failure. A path ending in '/' names a directory, not a file: refused, nothing made. (The
// writer refuses what the path itself is: empty, a directory, a FIFO, a device.)
inline void prepare_output_file(const std::string& out, const char* out_flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  MX_REQUIRE(out.empty() || out.back() != '/', out_flag, " ", out,
             " ends in '/': it names a directory, not a file");
  if (out.empty()) return;
  const fs::path parent = fs::path(out).parent_path();
  if (parent.empty() || fs::is_directory(parent, ec)) return;
  fs::create_directories(parent, ec);
  // (a component that is a file, a name too long: the flag's fault, exit 2; else exit 3)
  if (ec)
    throw_path_error(ec.value(), str("cannot create the directory of ", out_flag, " ", out, ": ",
                                     ec.message()));
}

}  // namespace mx::cli
