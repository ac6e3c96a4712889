#include "checkpoint/local.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"

namespace fs = std::filesystem;

namespace mx {

namespace {

constexpr int kFormatVersion = 1;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

bool is_committed_step(const fs::path& p) {
  static const std::regex re("step_[0-9]{8}");
  std::error_code ec;
  return std::regex_match(p.filename().string(), re) && fs::is_directory(p, ec) &&
         fs::is_regular_file(p / "state.json", ec);
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw StorageError(str("cannot write ", path.string()));
}

std::vector<fs::path> committed_steps(const std::string& root) {
  std::vector<fs::path> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (auto& e : fs::directory_iterator(root, ec))
    if (is_committed_step(e.path())) steps.push_back(e.path());
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

std::string save_local_checkpoint(const std::string& root, int64_t step, const ModelConfig& config,
                                  const ParamLayout& layout, const float* params, const float* m,
                                  const float* v, const nlohmann::json& state) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw StorageError(str("cannot create checkpoint directory ", root, ": ", ec.message()));
  fs::path final_dir = fs::path(root) / step_name(step);
  fs::path tmp_dir = fs::path(root) / str(".", step_name(step), ".tmp-", ::getpid());
  fs::remove_all(tmp_dir, ec);
  save_hf_model(tmp_dir.string(), config, layout, params, "F32");
  if (m && v) {
    SafeTensorsWriter w;
    for (const ParamTensor& t : layout.tensors()) {
      w.add_f32("exp_avg." + t.hf_name, t.shape, m + t.offset);
      w.add_f32("exp_avg_sq." + t.hf_name, t.shape, v + t.offset);
    }
    w.write((tmp_dir / "optimizer.safetensors").string());
  }
  nlohmann::json s = state;
  s["format_version"] = kFormatVersion;
  s["step"] = step;
  write_text_file(tmp_dir / "state.json", s.dump(2) + "\n");
  // Commit: an existing directory of the same step (a rerun) is replaced only now.
  if (fs::exists(final_dir, ec)) {
    fs::path old = fs::path(root) / str(".", step_name(step), ".old-", ::getpid());
    fs::rename(final_dir, old, ec);
    if (ec) throw StorageError(str("cannot replace ", final_dir.string(), ": ", ec.message()));
    fs::rename(tmp_dir, final_dir, ec);
    fs::remove_all(old);
  } else {
    fs::rename(tmp_dir, final_dir, ec);
  }
  if (ec) throw StorageError(str("cannot commit checkpoint ", final_dir.string(), ": ", ec.message()));
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& root) {
  auto steps = committed_steps(root);
  return steps.empty() ? "" : steps.back().string();
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  MX_REQUIRE(fs::exists(path, ec), "checkpoint ", path, " does not exist");
  if (is_committed_step(path) || fs::is_regular_file(fs::path(path) / "state.json", ec))
    return path;
  std::string latest = latest_checkpoint(path);
  MX_REQUIRE(!latest.empty(), path, " is neither a checkpoint step directory nor a directory ",
             "holding committed steps (step_NNNNNNNN/state.json)");
  return latest;
}

ModelConfig checkpoint_model_config(const std::string& step_dir) {
  return read_hf_config((fs::path(step_dir) / "config.json").string());
}

nlohmann::json checkpoint_state(const std::string& step_dir) {
  fs::path p = fs::path(step_dir) / "state.json";
  std::ifstream in(p);
  MX_REQUIRE(in, "cannot read ", p.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception&) {
    throw UserError(str(p.string(), " is not valid JSON"));
  }
  MX_REQUIRE(j.is_object() && j.contains("step") && j["step"].is_number_integer(), p.string(),
             " has no integer 'step'");
  MX_REQUIRE(j.value("format_version", 0) == kFormatVersion, p.string(),
             " has an unsupported format_version");
  return j;
}

void load_local_checkpoint(const std::string& step_dir, const ParamLayout& layout, float* params,
                           float* m, float* v) {
  load_hf_weights(step_dir, layout, params);
  if (!m || !v) return;
  SafeTensorsReader r((fs::path(step_dir) / "optimizer.safetensors").string());
  for (const ParamTensor& t : layout.tensors()) {
    for (auto [prefix, dst] : {std::pair{"exp_avg.", m}, std::pair{"exp_avg_sq.", v}}) {
      std::string name = prefix + t.hf_name;
      MX_REQUIRE(r.has(name), r.path(), " lacks ", name);
      MX_REQUIRE(r.entry(name).shape == t.shape, r.path(), ": ", name, " has the wrong shape");
      r.read_f32(name, dst + t.offset, t.numel);
    }
  }
}

void prune_checkpoints(const std::string& root, int64_t keep) {
  if (keep <= 0) return;
  auto steps = committed_steps(root);
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i) fs::remove_all(steps[i], ec);
}

}  // namespace mx
