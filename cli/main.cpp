// mxtrain: the command line. Every failure the user can cause ends here as one `error:` line:
// exit 2 for bad input, 3 for storage failures.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mxtrain: an LLM pretraining engine (Llama-style models, CPU and CUDA)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  mx::cli::Action action;
  mx::cli::add_train(app, action);
  mx::cli::add_debug(app, action);
  mx::cli::add_ckpt(app, action);
  mx::cli::add_generate(app, action);
  mx::cli::add_bench(app, action);
  mx::cli::add_numerics(app, action);
  mx::cli::add_plan(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see mxtrain --help)\n", e.what());
    return 2;
  }
  try {
    return action ? action() : 2;
  } catch (const mx::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const mx::StorageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory (try a smaller train.micro_batch or seq_len, or "
                         "memory.activation_checkpointing = full)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: internal error (a bug in mxtrain, please report): %s\n",
                 e.what());
    return 1;
  }
}
