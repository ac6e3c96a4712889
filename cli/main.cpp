// mxtrain: the command line. Every failure the user can cause ends here as one `error:` line:
// exit 2 for bad input, 3 for storage failures.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/blas_core.h"
#include "cli/commands.h"
#include "mxtrain_git_commit.h"  // (generated: cmake/git_commit.cmake)
#include "core/error.h"
#include "parallel/communicator.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, which every writer reports,
  // instead of killing the process mid-checkpoint without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  // A closed pipe (`mxtrain train ... 2>&1 | head -1`, a peer resetting the S3 connection)
  // killed the process with SIGPIPE: exit 141 without a word, mid-run without a checkpoint.
  // Ignored, a write there fails with EPIPE: a result on stdout that cannot be written is
  // exit 3 (stdout_written below), a progress line on stderr is lost and the run goes on.
  std::signal(SIGPIPE, SIG_IGN);
  // A training process (mxtrain train, a rank mpirun started) takes a stop request from its
  // first instructions: mpirun relays SIGUSR1 to ranks that may still be starting. Not the
  // SageMaker launcher or a worker host's waiting entrypoint: they have no step boundary to
  // stop at, and a SIGTERM ends them as it always did.
  if (argc > 1 && (std::strcmp(argv[1], "train") == 0 ||
                   (std::strcmp(argv[1], "sagemaker") == 0 && std::getenv("OMPI_COMM_WORLD_SIZE"))))
    mx::install_stop_signal_handlers();
  // Before anything else: may run the program again with OPENBLAS_CORETYPE set, when OpenBLAS
  // took this CPU for an older one (backend/cpu/blas_core.h).
  mx::select_blas_core(argv);
#ifdef MXTRAIN_HAVE_CUDA
  mx::register_cuda_backend();  // run.device = cuda (backend/cuda/)
#endif
  CLI::App app{"mxtrain: an LLM pretraining engine (Llama-style models, CPU and CUDA)"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  // (no version number: the commit names the build; empty outside a git checkout)
  app.set_version_flag("--version", std::string("mxtrain, built from ") +
                                        (*MXTRAIN_GIT_COMMIT ? "commit " MXTRAIN_GIT_COMMIT
                                                             : "an unknown commit"));
  mx::cli::Action action;
  mx::cli::add_train(app, action);
  mx::cli::add_debug(app, action);
  mx::cli::add_ckpt(app, action);
  mx::cli::add_generate(app, action);
  mx::cli::add_bench(app, action);
  mx::cli::add_numerics(app, action);
  mx::cli::add_plan(app, action);
  mx::cli::add_sweep(app, action);
  mx::cli::add_sagemaker(app, action);
  // Integers are decimal, as `--set` reads them (docs/config.md): CLI11 read 010 as octal 8
  // and 0x10 as 16, and clamped a value beyond 64 bits to the largest one (--seed
  // 99999999999999999999 ran as 2^63 - 1); an unsigned option took -1 as 2^64 - 1. A decimal
  // value is passed on without its leading zeros, so that CLI11 cannot read it as octal.
  auto decimal = [](bool is_unsigned) {
    return CLI::Validator(
        [is_unsigned](std::string& v) -> std::string {
          if (v.empty()) return "an empty value is not a number";
          const bool sign = v[0] == '+' || v[0] == '-';
          const std::string digits = v.substr(sign ? 1 : 0);
          if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
            return is_unsigned ? "expected a decimal integer >= 0"
                               : "expected a decimal integer";
          if (is_unsigned && v[0] == '-' && digits.find_first_not_of('0') != std::string::npos)
            return "expected a decimal integer >= 0";
          const size_t first = std::min(digits.find_first_not_of('0'), digits.size() - 1);
          const bool minus = v[0] == '-' && !is_unsigned;  // (an unsigned -0 is 0)
          const std::string normal = (minus ? "-" : "") + digits.substr(first);
          errno = 0;
          char* end = nullptr;
          if (is_unsigned) std::strtoull(normal.c_str(), &end, 10);
          else std::strtoll(normal.c_str(), &end, 10);
          if (errno == ERANGE)
            return is_unsigned ? "out of range for a 64-bit unsigned integer"
                               : "out of range for a 64-bit integer";
          v = normal;
          return "";
        },
        "");
  };
  const CLI::Validator in_int64 = decimal(false), in_uint64 = decimal(true);
  // `--top-k ""` (an empty argument, as an unset shell variable gives) was read as 0.
  const CLI::Validator not_empty(
      [](std::string& v) -> std::string { return v.empty() ? "an empty value is not a number" : ""; },
      "");
  std::vector<CLI::App*> apps{&app};
  for (size_t i = 0; i < apps.size(); ++i) {
    for (CLI::Option* o : apps[i]->get_options()) {
      const std::string type = o->get_type_name();
      if (type == "INT" || type == "UINT" || type == "FLOAT") o->check(not_empty);
      if (type == "INT") o->transform(in_int64);  // (transform: it may rewrite the value)
      if (type == "UINT") o->transform(in_uint64);
    }
    for (CLI::App* sub : apps[i]->get_subcommands([](CLI::App*) { return true; }))
      apps.push_back(sub);
  }
  // CLI11 reads an unknown subcommand word as a stray positional and says only that a
  // subcommand is required: name the word and the subcommands instead, at every level that
  // requires one (`mxtrain sagemaker serve`, SageMaker's hosting command, as `mxtrain serve`).
  std::string path = "mxtrain";
  CLI::App* level = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    std::string known;
    CLI::App* next = nullptr;
    for (CLI::App* sub : level->get_subcommands([](CLI::App*) { return true; })) {
      if (sub->check_name(argv[i])) next = sub;
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!next) {
      if (level != &app && level->get_require_subcommand_min() == 0) break;  // a positional
      std::fprintf(stderr, "error: unknown subcommand '%s' of %s (known: %s; see %s --help)\n",
                   mx::one_line(argv[i]).c_str(), path.c_str(), known.c_str(), path.c_str());
      return 2;
    }
    path += " " + next->get_name();
    level = next;
    if (level->get_subcommands([](CLI::App*) { return true; }).empty()) break;
  }
  // A rank of a multi-process job that would exit 0 without having joined it: the ranks that
  // joined would wait for it forever (an app file giving one rank `train --help`).
  auto joined = [&](int rc) {
    if (rc != 0 || !mx::rank_left_job_unjoined()) return rc;
    std::string cmd = "mxtrain";
    for (int i = 1; i < argc; ++i) cmd += std::string(" ") + argv[i];
    std::fflush(stdout);
    if (!mx::let_rank0_report_first()) return 2;
    std::fprintf(stderr, "error: %sthis process is a rank of a multi-process job (mpirun), but "
                 "`%s` ended without joining it, so the other ranks would wait for it forever: "
                 "start every rank with the same `mxtrain train` command, and run other "
                 "commands without mpirun\n", mx::launcher_rank_prefix().c_str(),
                 mx::shortened(mx::one_line(cmd), 300).c_str());
    return 2;
  };
  // In a multi-process job a failing rank must end every rank (the others may be waiting for
  // it inside a collective): abort_all prints `error: rank R: ...` and aborts the job.
  auto fail = [](int code, const std::string& text) -> int {
    const std::string message = mx::shortened(mx::one_line(text), 4000);
    if (mx::in_multi_process_job()) mx::abort_all(code, message);
    // Under a launcher before the world exists (a config error): still say which rank
    if (!mx::let_rank0_report_first()) return code;
    std::fprintf(stderr, "error: %s%s\n", mx::launcher_rank_prefix().c_str(), message.c_str());
    return code;
  };
  // What the command printed must have reached its destination (a redirect onto a full disk,
  // /dev/full, a closed pipe): a storage failure otherwise, not exit 0 with an empty file.
  // (`earlier`: the errno of a write that failed before, as the version line's own flush)
  auto stdout_written = [&](int rc, int earlier = 0) {
    errno = 0;
    if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return rc;
    const int err = errno ? errno : earlier;
    const std::string why = err ? std::strerror(err) : "write error";
    return rc == 0 ? fail(3, "cannot write standard output: " + why) : rc;
  };
  // CLI11 prints help and the version itself; the errno of its failed write is kept
  auto printed = [&](const CLI::Error& e) {
    errno = 0;
    const int rc = app.exit(e);
    return stdout_written(rc, errno);
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {  // (help, as any output, must have been written)
    return joined(printed(e));
  } catch (const CLI::CallForAllHelp& e) {
    return joined(printed(e));
  } catch (const CLI::CallForVersion& e) {
    return joined(printed(e));
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    // CLI11 2.1 lists the unexpected arguments it kept back in reverse (rjoin of a list in
    // order): `mxtrain --set a=b train` said "not expected: a=b --set". In argv's order.
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      const std::vector<std::string> rest = app.remaining(true);
      const std::string reversed = CLI::detail::rjoin(rest, " ");
      const std::string in_order = CLI::detail::join(rest, " ");
      const size_t at = what.size() >= reversed.size() ? what.size() - reversed.size() : 0;
      if (rest.size() > 1 && what.compare(at, std::string::npos, reversed) == 0)
        what = what.substr(0, at) + in_order;
    }
    std::fprintf(stderr, "error: %s (see mxtrain --help)\n", mx::one_line(what).c_str());
    return 2;
  }
  try {
    return joined(stdout_written(action ? action() : 2));
  } catch (const mx::UserError& e) {
    return fail(2, e.what());
  } catch (const mx::StorageError& e) {
    return fail(3, e.what());
  } catch (const std::bad_alloc&) {
    // (argv[1] is a known subcommand here: checked above)
    const std::string sub = argc > 1 ? argv[1] : "";
    return fail(2, sub == "generate"
                       ? "out of memory (try fewer --max-tokens or a shorter --prompt)"
                       : "out of memory (try a smaller train.micro_batch or seq_len, or "
                         "memory.activation_checkpointing = full)");
  } catch (const std::exception& e) {
    return fail(1, std::string("internal error (a bug in mxtrain, please report): ") + e.what());
  }
}
