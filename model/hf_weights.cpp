#include "model/hf_weights.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"
#include "core/load_progress.h"
#include "core/output_dirs.h"
#include "model/hf_config.h"

namespace fs = std::filesystem;

namespace mx {

bool is_hf_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "config.json", ec);
}

namespace {
// The safetensors files of a model directory: model.safetensors, or the shards an index names.
std::vector<std::string> weight_files(const std::string& dir) {
  fs::path single = fs::path(dir) / "model.safetensors";
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::is_regular_file(single, ec)) return {single.string()};
  if (fs::is_regular_file(index, ec)) {
    std::ifstream in(index);
    std::stringstream text;
    if (in) text << in.rdbuf();
    if (!in || in.bad()) throw StorageError(str("cannot read ", index.string()));
    std::string why;
    nlohmann::json j = parse_json_input(text.str(), &why);
    if (j.is_discarded()) throw UserError(str(index.string(), " ", why));
    MX_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               index.string(), " has no weight_map object");
    std::set<std::string> files;
    for (auto& [name, file] : j["weight_map"].items()) {
      MX_REQUIRE(file.is_string(), index.string(), ": weight_map entry ", name,
                 " is not a string");
      std::string f = file.get<std::string>();
      // (a NUL would end the name the file system sees: "m.st\u0000x" opened m.st)
      MX_REQUIRE(is_plain_file_name(f), index.string(), ": shard file name ", json_excerpt(file),
                 " is not a plain file name in the directory (empty, '/', '\\', '..' or a NUL "
                 "byte)");
      files.insert((fs::path(dir) / f).string());
    }
    return {files.begin(), files.end()};
  }
  throw UserError(str("no model.safetensors or model.safetensors.index.json in ", dir));
}
}  // namespace

namespace {
// The model's files opened (headers only) and matched against the layout: every tensor present
// once with the config's shape, none the model lacks. source[i] is where layout.tensors()[i] is.
struct OpenedWeights {
  std::vector<std::unique_ptr<SafeTensorsReader>> readers;
  std::vector<const SafeTensorsReader*> source;
};

OpenedWeights open_hf_weights(const std::string& dir, const ParamLayout& layout) {
  OpenedWeights w;
  for (auto& f : weight_files(dir)) w.readers.push_back(std::make_unique<SafeTensorsReader>(f));
  std::set<std::string> used;
  for (const ParamTensor& t : layout.tensors()) {
    const SafeTensorsReader* r = nullptr;
    for (auto& rd : w.readers)
      if (rd->has(t.hf_name)) {
        // (the last file had won, whatever the index said)
        MX_REQUIRE(!r, "tensor ", t.hf_name, " is in both ", r ? r->path() : "", " and ",
                   rd->path(), ": which one the model has is ambiguous");
        r = rd.get();
      }
    MX_REQUIRE(r, "weights in ", dir, " lack tensor ", t.hf_name);
    const TensorEntry& e = r->entry(t.hf_name);
    MX_REQUIRE(e.shape == t.shape, "tensor ", t.hf_name, " in ", r->path(), " has shape ",
               nlohmann::json(e.shape).dump(), ", the config needs ",
               nlohmann::json(t.shape).dump());
    w.source.push_back(r);
    used.insert(t.hf_name);
  }
  for (auto& rd : w.readers)
    for (const TensorEntry& e : rd->tensors()) {
      if (used.count(e.name)) continue;
      // Tied models sometimes still carry lm_head; old exports carry rotary caches.
      if (e.name == "lm_head.weight" || e.name.find("rotary_emb.inv_freq") != std::string::npos)
        continue;
      throw UserError(str("weights in ", rd->path(), " have tensor ", e.name,
                          " that a Llama model of this config does not have"));
    }
  return w;
}
}  // namespace

void check_hf_weights(const std::string& dir, const ParamLayout& layout) {
  open_hf_weights(dir, layout);
}

void load_hf_weights(const std::string& dir, const ParamLayout& layout, float* params,
                     bool stoppable) {
  const OpenedWeights w = open_hf_weights(dir, layout);
  const auto& tensors = layout.tensors();
  int64_t total = 0;
  for (const ParamTensor& t : tensors) total += t.numel * int64_t(sizeof(float));
  LoadProgress progress("loading " + dir, total, stoppable);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ParamTensor& t = tensors[i];
    const SafeTensorsReader* r = w.source[i];
    progress.before_piece();
    r->read_f32(t.hf_name, params + t.offset, t.numel);
    progress.after_piece(t.numel * int64_t(sizeof(float)));
    // A NaN or infinity computes garbage from the first token (generate printed it, training
    // called it divergence): name the tensor instead.
    const float* v = params + t.offset;
    bool finite = true;
#pragma omp parallel for reduction(&& : finite) schedule(static)
    for (int64_t j = 0; j < t.numel; ++j) finite = finite && std::isfinite(v[j]);
    for (int64_t j = 0; !finite && j < t.numel; ++j)
      MX_REQUIRE(std::isfinite(v[j]), "tensor ", t.hf_name, " in ", r->path(),
                 " holds a non-finite value (", v[j], ") at element ", j);
  }
}

void save_hf_model(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                   const float* params, const std::string& dtype) {
  std::error_code ec;
  MX_REQUIRE(!dir.empty(), "the output directory path is empty");
  MX_REQUIRE(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "the output directory ", dir,
             " exists and is not a directory");
  fs::create_directories(dir, ec);
  // (a path through a file, a name too long: the argument's fault, exit 2; else exit 3)
  if (ec) throw_path_error(ec.value(), str("cannot create directory ", dir, ": ", ec.message()));
  SafeTensorsWriter w;
  for (const ParamTensor& t : layout.tensors()) w.add_f32(t.hf_name, t.shape, params + t.offset, dtype);
  w.set_metadata("format", "pt");
  // Both files are written whole under temporary names, then renamed in as a pair: a failure
  // (a full disk, a rename refused) leaves the earlier pair as it was, never new weights beside
  // an old config. (A kill between the two renames can still part them.)
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string weights_path = (fs::path(dir) / "model.safetensors").string();
  const std::string text = hf_config_text(config, dtype == "BF16" ? "bfloat16" : "float32");
  const std::string staged = stage_file(config_path, {ByteSpan{text.data(), text.size()}});
  std::string staged_weights;
  try {
    staged_weights = w.stage(weights_path);
  } catch (...) {
    fs::remove(staged, ec);
    throw;
  }
  commit_staged_files({{staged_weights, weights_path}, {staged, config_path}});
}

}  // namespace mx
