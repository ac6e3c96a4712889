// mxtrain ckpt: inspect checkpoints and export them as Hugging Face models.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/export_hf.h"
#include "checkpoint/local.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/hf_weights.h"

namespace mx::cli {

namespace {
int export_hf(const std::string& checkpoint, const std::string& out_dir, std::string dtype) {
  std::string step_dir = export_checkpoint_hf(checkpoint, out_dir, dtype);
  for (auto& ch : dtype) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  std::printf("exported %s -> %s (%s)\n", step_dir.c_str(), out_dir.c_str(), dtype.c_str());
  return 0;
}

// CHECKPOINT: a step directory (that step) or a root (every committed step under it).
int verify(const std::string& checkpoint) {
  std::error_code ec;
  MX_REQUIRE(std::filesystem::exists(checkpoint, ec), "checkpoint ", checkpoint, " does not exist");
  std::vector<std::string> steps;
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(checkpoint) / "manifest.json", ec) ||
      fs::exists(fs::path(checkpoint) / "state.json", ec))
    steps.push_back(checkpoint);
  else
    steps = committed_checkpoints(checkpoint);
  MX_REQUIRE(!steps.empty(), "no committed checkpoints under ", checkpoint);
  int bad = 0;
  for (const auto& dir : steps) {
    std::string why = verify_checkpoint(dir);
    if (why.empty()) {
      std::printf("OK %s\n", dir.c_str());
    } else {
      std::fprintf(stderr, "error: %s\n", why.c_str());
      ++bad;
    }
  }
  std::fflush(stdout);
  return bad ? 2 : 0;
}

int list(const std::string& root, bool check) {
  auto steps = committed_checkpoints(root);
  MX_REQUIRE(!steps.empty(), "no committed checkpoints under ", root);
  std::printf("%-10s %6s %14s %s  %s\n", "step", "files", "bytes", check ? "verified" : "", "dir");
  int bad = 0;
  for (const auto& dir : steps) {
    long long step = -1, files = 0;
    unsigned long long bytes = 0;
    try {
      auto m = checkpoint_manifest(dir);
      step = m.value("step", int64_t(-1));
      for (const auto& f : m.value("files", nlohmann::json::array())) {
        ++files;
        if (f.contains("size") && f["size"].is_number_unsigned()) bytes += f["size"].get<uint64_t>();
      }
    } catch (const std::exception&) {
    }
    std::string status;
    if (check) {
      std::string why = verify_checkpoint(dir);
      status = why.empty() ? "yes" : "NO";
      if (!why.empty()) {
        ++bad;
        std::fprintf(stderr, "warning: %s\n", why.c_str());
      }
    }
    std::printf("%-10lld %6lld %14llu %s  %s\n", step, files, bytes, status.c_str(), dir.c_str());
  }
  return 0;
}
}  // namespace

void add_ckpt(CLI::App& app, Action& action) {
  auto* ckpt = app.add_subcommand("ckpt", "checkpoint tools");
  ckpt->require_subcommand(1);
  auto* exp = ckpt->add_subcommand("export-hf", "write a checkpoint as a Hugging Face model");
  auto checkpoint = std::make_shared<std::string>();
  auto out_dir = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  exp->add_option("CHECKPOINT", *checkpoint, "step directory, or a root (its newest step)")
      ->required();
  exp->add_option("OUT_DIR", *out_dir, "output directory")->required();
  exp->add_option("--dtype", *dtype, "f32 | bf16");
  exp->callback([&action, checkpoint, out_dir, dtype] {
    action = [=] { return export_hf(*checkpoint, *out_dir, *dtype); };
  });
  auto* ls = ckpt->add_subcommand("ls", "list the committed steps under a checkpoint root");
  auto root = std::make_shared<std::string>();
  auto check = std::make_shared<bool>(false);
  ls->add_option("ROOT", *root, "checkpoint root")->required();
  ls->add_flag("--verify", *check, "check every file's size and CRC32C against the manifest");
  ls->callback([&action, root, check] {
    action = [root, check] { return list(*root, *check); };
  });
  auto* ver = ckpt->add_subcommand("verify", "check a checkpoint against its manifest");
  auto target = std::make_shared<std::string>();
  ver->add_option("CHECKPOINT", *target, "step directory, or a root (every committed step)")
      ->required();
  ver->callback([&action, target] {
    action = [target] { return verify(*target); };
  });
}

}  // namespace mx::cli
