// mxtrain ckpt: inspect checkpoints and export them as Hugging Face models.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/export_hf.h"
#include "checkpoint/sharded.h"
#include "checkpoint/storage.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/hf_weights.h"

namespace mx::cli {

namespace {
int export_hf(const std::string& checkpoint, const std::string& out_dir, std::string dtype) {
  std::string step_location = export_checkpoint_hf(checkpoint, out_dir, dtype);
  for (auto& ch : dtype) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  std::printf("exported %s -> %s (%s)\n", one_line(step_location).c_str(),
              one_line(out_dir).c_str(), dtype.c_str());  // (a newline in a path: one line)
  return 0;
}

// The store and steps a CHECKPOINT argument names: one step, or every committed step of a root.
std::pair<std::unique_ptr<CheckpointStore>, std::vector<int64_t>> steps_of(
    const std::string& checkpoint) {
  CheckpointLocation loc = parse_checkpoint_location(checkpoint);
  auto store = open_checkpoint_store(loc.root);
  if (!store->is_s3()) {
    std::error_code ec;
    MX_REQUIRE(std::filesystem::exists(checkpoint, ec), "checkpoint ", checkpoint,
               " does not exist");
  }
  std::vector<int64_t> steps;
  if (loc.step >= 0) steps.push_back(loc.step);
  else steps = store->committed_steps();
  MX_REQUIRE(!steps.empty(), "no committed checkpoints under ", checkpoint);
  return {std::move(store), steps};
}

// CHECKPOINT: a step (that step) or a root (every committed step under it).
int verify(const std::string& checkpoint, bool full) {
  auto [store, steps] = steps_of(checkpoint);
  int bad = 0;
  for (int64_t step : steps) {
    std::string why = verify_checkpoint(*store, step, full);
    if (why.empty()) {
      std::printf("OK %s\n", store->step_location(step).c_str());
    } else {
      std::fprintf(stderr, "error: %s\n", one_line(why).c_str());
      ++bad;
    }
  }
  std::fflush(stdout);
  return bad ? 2 : 0;
}

int list(const std::string& root, bool check, bool full) {
  auto [store, steps] = steps_of(root);
  std::printf("%-10s %6s %6s %14s %s  %s\n", "step", "ranks", "files", "bytes",
              check ? "verified" : "", "location");
  for (int64_t s : steps) {
    long long files = 0, ranks = -1;
    unsigned long long bytes = 0;
    try {
      CheckpointReader reader(*store, s);
      ranks = reader.world_size();
      for (const auto& f : reader.manifest()["files"]) {
        ++files;
        bytes += f["size"].get<uint64_t>();
      }
    } catch (const StorageError&) {
      throw;  // the store failed, not the step: exit 3, no invented row
    } catch (const std::exception&) {  // a bad manifest: the row says -1 (and NO with --verify)
    }
    std::string status;
    if (check) {
      std::string why = verify_checkpoint(*store, s, full);
      status = why.empty() ? "yes" : "NO";
      if (!why.empty()) std::fprintf(stderr, "warning: %s\n", why.c_str());
    }
    std::printf("%-10lld %6lld %6lld %14llu %s  %s\n", static_cast<long long>(s), ranks, files,
                bytes, status.c_str(), store->step_location(s).c_str());
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
  exp->add_option("CHECKPOINT", *checkpoint,
                  "step (DIR/step_NNNNNNNN or s3://...), or a root (its newest step)")
      ->required();
  exp->add_option("OUT_DIR", *out_dir, "output directory")->required();
  exp->add_option("--dtype", *dtype, "f32 | bf16");
  exp->callback([&action, checkpoint, out_dir, dtype] {
    action = [=] { return export_hf(*checkpoint, *out_dir, *dtype); };
  });
  auto* ls = ckpt->add_subcommand("ls", "list the committed steps under a checkpoint root");
  auto root = std::make_shared<std::string>();
  auto check = std::make_shared<bool>(false);
  auto ls_full = std::make_shared<bool>(false);
  ls->add_option("ROOT", *root, "checkpoint root: a directory or s3://bucket/prefix")->required();
  ls->add_flag("--verify", *check, "check every step against its manifest");
  ls->add_flag("--full", *ls_full, "S3: also download every file and check its CRC32C");
  ls->callback([&action, root, check, ls_full] {
    action = [root, check, ls_full] { return list(*root, *check, *ls_full); };
  });
  auto* ver = ckpt->add_subcommand("verify", "check a checkpoint against its manifest");
  auto target = std::make_shared<std::string>();
  auto full = std::make_shared<bool>(false);
  ver->add_option("CHECKPOINT", *target, "a step, or a root (every committed step); local or s3://")
      ->required();
  ver->add_flag("--full", *full,
                "S3: also download every file and check its CRC32C (local: always)");
  ver->callback([&action, target, full] {
    action = [target, full] { return verify(*target, *full); };
  });
}

}  // namespace mx::cli
