// Subcommands register themselves on the CLI11 app; the chosen one's action runs after parsing.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

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

}  // namespace mx::cli
