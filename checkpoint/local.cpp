#include "checkpoint/local.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_config.h"
#include "model/hf_weights.h"

namespace fs = std::filesystem;

namespace mx {

namespace {

constexpr const char* kManifest = "manifest.json";
// A manifest is a few KB per hundred tensors; anything larger is not one of ours.
constexpr uintmax_t kMaxManifestBytes = 64u << 20;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

bool is_step_name(const std::string& name) {
  static const std::regex re("step_[0-9]{8}");
  return std::regex_match(name, re);
}

bool is_committed_step(const fs::path& p) {
  std::error_code ec;
  return is_step_name(p.filename().string()) && fs::is_directory(p, ec) &&
         fs::is_regular_file(p / kManifest, ec);
}

void fsync_path(const fs::path& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw StorageError(str("cannot open ", path.string(), " to fsync"));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw StorageError(str("cannot fsync ", path.string()));
}

// A manifest's file name must name a file inside the step directory and nothing else.
bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  if (name.find("..") != std::string::npos) return false;
  for (char c : name)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

nlohmann::json read_json_file(const fs::path& p, uintmax_t max_bytes) {
  std::error_code ec;
  uintmax_t size = fs::file_size(p, ec);
  MX_REQUIRE(!ec, "cannot read ", p.string());
  MX_REQUIRE(size <= max_bytes, p.string(), " is ", size, " bytes, more than a manifest can be");
  std::ifstream in(p, std::ios::binary);
  MX_REQUIRE(in, "cannot read ", p.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception&) {
    throw UserError(str(p.string(), " is not valid JSON"));
  }
}

}  // namespace

std::vector<std::string> committed_checkpoints(const std::string& root) {
  std::vector<fs::path> steps;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (auto& e : fs::directory_iterator(root, ec))
      if (is_committed_step(e.path())) steps.push_back(e.path());
  std::sort(steps.begin(), steps.end());
  std::vector<std::string> out;
  for (auto& p : steps) out.push_back(p.string());
  return out;
}

std::string save_local_checkpoint(const std::string& root, int64_t step, const ModelConfig& config,
                                  const ParamLayout& layout, const float* params, const float* m,
                                  const float* v, const nlohmann::json& state) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw StorageError(str("cannot create checkpoint directory ", root, ": ", ec.message()));
  fs::path final_dir = fs::path(root) / step_name(step);
  fs::path tmp_dir = fs::path(root) / str(".", step_name(step), ".tmp-", ::getpid());
  fs::remove_all(tmp_dir, ec);
  nlohmann::json tensors = nlohmann::json::array();
  // Each writer fsyncs its file before renaming it into the temporary directory.
  save_hf_model(tmp_dir.string(), config, layout, params, "F32");
  for (const ParamTensor& t : layout.tensors())
    tensors.push_back({{"file", "model.safetensors"}, {"name", t.hf_name}, {"shape", t.shape}});
  std::vector<std::string> files = {"model.safetensors", "config.json"};
  if (m && v) {
    SafeTensorsWriter w;
    for (const ParamTensor& t : layout.tensors()) {
      w.add_f32("exp_avg." + t.hf_name, t.shape, m + t.offset);
      w.add_f32("exp_avg_sq." + t.hf_name, t.shape, v + t.offset);
      for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
        tensors.push_back({{"file", "optimizer.safetensors"},
                           {"name", prefix + t.hf_name},
                           {"shape", t.shape}});
    }
    w.write((tmp_dir / "optimizer.safetensors").string());
    files.push_back("optimizer.safetensors");
  }
  nlohmann::json s = state;
  s["format_version"] = kCheckpointFormatVersion;
  s["step"] = step;
  write_file_atomic((tmp_dir / "state.json").string(), s.dump(2) + "\n");
  files.push_back("state.json");

  // The manifest, last: it checksums what is on disk now, after every file was fsynced.
  nlohmann::json manifest = {
      {"format_version", kCheckpointFormatVersion},
      {"step", step},
      {"world_size", state.value("world_size", int64_t(1))},
      {"sharding", state.value("sharding", std::string("none"))},
      {"model", read_json_file(tmp_dir / "config.json", kMaxManifestBytes)},
  };
  nlohmann::json file_list = nlohmann::json::array();
  for (const std::string& name : files) {
    uint64_t size = 0;
    uint32_t crc = crc32c_file((tmp_dir / name).string(), &size);
    file_list.push_back({{"name", name}, {"size", size}, {"crc32c", crc32c_hex(crc)}});
  }
  manifest["files"] = file_list;
  manifest["tensors"] = tensors;
  write_file_atomic((tmp_dir / kManifest).string(), manifest.dump(1) + "\n");
  fsync_path(tmp_dir, true);

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
  fsync_path(root, true);
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& root) {
  auto steps = committed_checkpoints(root);
  return steps.empty() ? "" : steps.back();
}

nlohmann::json checkpoint_manifest(const std::string& step_dir) {
  return read_json_file(fs::path(step_dir) / kManifest, kMaxManifestBytes);
}

std::string verify_checkpoint(const std::string& step_dir) {
  const fs::path dir(step_dir);
  const std::string mpath = (dir / kManifest).string();
  std::error_code ec;
  if (!fs::is_regular_file(dir / kManifest, ec)) return str(mpath, ": missing (not committed)");
  nlohmann::json m;
  try {
    m = checkpoint_manifest(step_dir);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!m.is_object()) return str(mpath, ": not a JSON object");
  if (!m.contains("format_version") || !m["format_version"].is_number_integer() ||
      m["format_version"].get<int64_t>() != kCheckpointFormatVersion)
    return str(mpath, ": unsupported or missing format_version");
  if (!m.contains("step") || !m["step"].is_number_integer())
    return str(mpath, ": no integer 'step'");
  if (!m.contains("files") || !m["files"].is_array()) return str(mpath, ": no 'files' list");

  // Pass 1: the manifest itself, before any file is opened.
  struct FileEntry {
    std::string name;
    uint64_t size;
    std::string crc;
  };
  std::vector<FileEntry> files;
  std::set<std::string> names;
  for (const auto& f : m["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("crc32c") || !f["crc32c"].is_string())
      return str(mpath, ": a 'files' entry lacks name, size or crc32c");
    std::string name = f["name"].get<std::string>();
    if (!is_plain_file_name(name))
      return str(mpath, ": file name '", name, "' is not a plain file name");
    if (!names.insert(name).second) return str(mpath, ": lists '", name, "' twice");
    files.push_back({name, f["size"].get<uint64_t>(), f["crc32c"].get<std::string>()});
  }
  for (const char* required : {"model.safetensors", "config.json", "state.json"})
    if (!names.count(required)) return str(mpath, ": does not list ", required);

  // Pass 2: sizes (cheap, and before anything is read), then checksums.
  for (const auto& f : files) {
    fs::path p = dir / f.name;
    if (!fs::is_regular_file(p, ec)) return str(p.string(), ": missing");
    uintmax_t size = fs::file_size(p, ec);
    if (ec) return str(p.string(), ": cannot stat");
    if (size != f.size)
      return str(p.string(), ": size ", size, " bytes, manifest says ", f.size);
  }
  for (const auto& f : files) {
    fs::path p = dir / f.name;
    std::string crc;
    try {
      crc = crc32c_hex(crc32c_file(p.string()));
    } catch (const std::exception& e) {
      return str(p.string(), ": ", e.what());
    }
    if (crc != f.crc)
      return str(p.string(), ": CRC32C ", crc, ", manifest says ", f.crc, " (corrupt)");
  }

  // Pass 3: the safetensors parse and hold the tensors the manifest lists.
  std::map<std::string, std::vector<std::pair<std::string, std::vector<int64_t>>>> want;
  if (m.contains("tensors") && m["tensors"].is_array()) {
    for (const auto& t : m["tensors"]) {
      if (!t.is_object() || !t.contains("file") || !t["file"].is_string() ||
          !t.contains("name") || !t["name"].is_string() || !t.contains("shape") ||
          !t["shape"].is_array())
        return str(mpath, ": a 'tensors' entry lacks file, name or shape");
      std::string file = t["file"].get<std::string>();
      if (!names.count(file)) return str(mpath, ": tensor in unlisted file '", file, "'");
      std::vector<int64_t> shape;
      for (const auto& d : t["shape"]) {
        if (!d.is_number_integer()) return str(mpath, ": a tensor shape is not integers");
        shape.push_back(d.get<int64_t>());
      }
      want[file].emplace_back(t["name"].get<std::string>(), shape);
    }
  }
  for (const auto& f : files) {
    if (f.name.size() < 12 || f.name.substr(f.name.size() - 12) != ".safetensors") continue;
    fs::path p = dir / f.name;
    try {
      SafeTensorsReader r(p.string());
      for (const auto& [name, shape] : want[f.name]) {
        if (!r.has(name)) return str(p.string(), ": lacks tensor ", name);
        if (r.entry(name).shape != shape) return str(p.string(), ": ", name, " has the wrong shape");
      }
    } catch (const std::exception& e) {
      return str(p.string(), ": does not parse: ", e.what());
    }
  }
  return "";
}

std::string latest_verified_checkpoint(const std::string& root, bool report) {
  auto steps = committed_checkpoints(root);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    std::string why = verify_checkpoint(*it);
    if (why.empty()) return *it;
    if (report) warn(str("skipping checkpoint ", *it, ", which does not verify: ", why));
  }
  return "";
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  MX_REQUIRE(fs::exists(path, ec), "checkpoint ", path, " does not exist");
  std::string step_dir;
  if (fs::exists(fs::path(path) / kManifest, ec) || fs::exists(fs::path(path) / "state.json", ec) ||
      is_step_name(fs::path(path).lexically_normal().filename().string())) {
    step_dir = path;
  } else {
    step_dir = latest_checkpoint(path);
    MX_REQUIRE(!step_dir.empty(), path, " is neither a checkpoint step directory nor a directory ",
               "holding committed steps (step_NNNNNNNN/manifest.json)");
  }
  std::string why = verify_checkpoint(step_dir);
  MX_REQUIRE(why.empty(), "checkpoint ", step_dir, " does not verify: ", why);
  return step_dir;
}

ModelConfig checkpoint_model_config(const std::string& step_dir) {
  return read_hf_config((fs::path(step_dir) / "config.json").string());
}

nlohmann::json checkpoint_state(const std::string& step_dir) {
  fs::path p = fs::path(step_dir) / "state.json";
  nlohmann::json j = read_json_file(p, kMaxManifestBytes);
  MX_REQUIRE(j.is_object() && j.contains("step") && j["step"].is_number_integer(), p.string(),
             " has no integer 'step'");
  MX_REQUIRE(j.value("format_version", 0) == kCheckpointFormatVersion, p.string(),
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
  std::error_code ec;
  // Temporary directories of writers that died mid-checkpoint (never of this process).
  static const std::regex tmp_re("\\.step_[0-9]{8}\\.(tmp|old|del)-([0-9]+)");
  const std::string own_pid = std::to_string(::getpid());
  if (fs::is_directory(root, ec)) {
    std::vector<fs::path> stale;
    for (auto& e : fs::directory_iterator(root, ec)) {
      std::smatch mt;
      std::string name = e.path().filename().string();
      if (std::regex_match(name, mt, tmp_re) && mt[2].str() != own_pid) stale.push_back(e.path());
    }
    for (auto& p : stale) fs::remove_all(p, ec);
  }
  if (keep <= 0) return;
  auto steps = committed_checkpoints(root);
  // Uncommit first (rename to a hidden name), then delete: a kill in the middle of deleting
  // never leaves a step directory with a manifest but missing files.
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i) {
    fs::path hidden = fs::path(root) / str(".", fs::path(steps[i]).filename().string(), ".del-",
                                           own_pid);
    fs::rename(steps[i], hidden, ec);
    fs::remove_all(ec ? fs::path(steps[i]) : hidden, ec);
  }
}

}  // namespace mx
