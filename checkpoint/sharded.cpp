#include "checkpoint/sharded.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/json_input.h"
#include "core/load_progress.h"
#include "core/log.h"
#include "core/output_dirs.h"
#include "model/hf_config.h"
#include "numerics/quantize.h"

namespace mx {

namespace {

constexpr const char* kManifest = "manifest.json";
// A manifest is a few KB per hundred tensors; anything larger is not one of ours.
constexpr uint64_t kMaxManifestBytes = 64u << 20;
constexpr uint64_t kMaxSmallFileBytes = 64u << 20;

// Finds the first value of a rank file that loading would refuse (not finite; a negative
// second moment) as its bytes stream past: verify reads every byte for the CRC32C anyway. The
// 8-byte header length and the header are collected, the header parsed, then each F32
// tensor's own byte range is scanned, its elements counted from its start (a valid file may
// leave gaps between tensors or place them at any offset). A header that does not parse turns
// the scan off: the structural check after it says why.
struct FiniteScan {
  struct Range {
    uint64_t begin, end;  // in the file
    const std::string* name;
    bool nonneg;  // a second moment
  };
  FiniteScan(bool on, uint64_t file_bytes) : on(on), file_bytes(file_bytes) {}
  void feed(const uint8_t* p, size_t n) {
    size_t i = 0;
    while (on && bad_element < 0 && i < n) {
      if (pos < 8) {  // the header's length, little-endian
        header_len |= uint64_t(p[i++]) << (8 * pos++);
        if (pos == 8 && header_len > kMaxHeader) on = false;
        continue;
      }
      if (pos < 8 + header_len) {  // the header
        const size_t take = size_t(std::min<uint64_t>(n - i, 8 + header_len - pos));
        header.append(reinterpret_cast<const char*>(p + i), take);
        i += take;
        pos += take;
        if (pos == 8 + header_len) parse();
        continue;
      }
      while (next < ranges.size() && ranges[next].end <= pos) ++next;
      if (next == ranges.size()) return;  // past the last tensor
      const Range& r = ranges[next];
      if (pos < r.begin) {  // a gap before the tensor
        const size_t skip = size_t(std::min<uint64_t>(n - i, r.begin - pos));
        i += skip;
        pos += skip;
        continue;
      }
      const uint64_t off = pos - r.begin;
      if (off % 4 != 0 || n - i < 4) {  // an element split between pieces of the stream
        word[off % 4] = p[i++];
        ++pos;
        if (off % 4 == 3) check(word, r, off - 3);
        continue;
      }
      const size_t words = size_t(std::min<uint64_t>((n - i) / 4, (r.end - pos) / 4));
      for (size_t w = 0; w < words && bad_element < 0; ++w) check(p + i + 4 * w, r, off + 4 * w);
      i += 4 * words;
      pos += 4 * words;
    }
  }
  void parse() {
    try {
      index = parse_safetensors_header("", header.data(), header.size(), header_len, file_bytes);
    } catch (const std::exception&) {
      on = false;
      return;
    }
    for (const TensorEntry& t : index.tensors)
      if (t.dtype == "F32" && t.end > t.begin)
        ranges.push_back({index.data_start + t.begin, index.data_start + t.end, &t.name,
                          t.name.rfind("exp_avg_sq.", 0) == 0});
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    header.clear();
    header.shrink_to_fit();
  }
  void check(const uint8_t* bytes, const Range& r, uint64_t byte_offset) {
    uint32_t u;
    std::memcpy(&u, bytes, 4);
    const bool not_finite = (u & 0x7f800000u) == 0x7f800000u;  // exponent all ones
    const bool negative = (u & 0x80000000u) && (u & 0x7fffffffu);  // -0 is >= 0
    if (!not_finite && !(r.nonneg && negative)) return;
    bad_element = int64_t(byte_offset / 4);
    bad_tensor = *r.name;
    bad_nonneg = r.nonneg;
    std::memcpy(&bad_value, &u, 4);
  }
  static constexpr uint64_t kMaxHeader = uint64_t{100} << 20;
  bool on;
  uint64_t file_bytes, pos = 0, header_len = 0;
  std::string header;
  SafeTensorsIndex index;
  std::vector<Range> ranges;
  size_t next = 0;
  uint8_t word[4] = {};
  int64_t bad_element = -1;
  std::string bad_tensor;
  bool bad_nonneg = false;
  float bad_value = 0.0f;
};

const char* kind_prefix(StateKind k) {
  switch (k) {
    case StateKind::kMaster: return "master.";
    case StateKind::kExpAvg: return "exp_avg.";
    case StateKind::kExpAvgSq: return "exp_avg_sq.";
  }
  return "";
}

bool json_int(const nlohmann::json& j, const char* key, int64_t* out) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return false;
  *out = j[key].get<int64_t>();
  return true;
}

}  // namespace

int64_t ShardView::local_numel() const {
  int64_t n = 0;
  for (const auto& u : units) n += u.shard_numel;
  return n;
}

ShardView shard_view(const ParamLayout& layout, int shard_size, int shard_rank) {
  ShardView v;
  v.layout = &layout;
  v.shard_rank = shard_rank;
  int64_t off = 0;
  for (const auto& u : layout.units()) {
    v.units.push_back(make_shard_layout(u.numel, shard_size));
    v.local_offset.push_back(off);
    off += v.units.back().shard_numel;
  }
  return v;
}

ShardView whole_model_view(const ParamLayout& layout) {
  ShardView v = shard_view(layout, 1, 0);
  for (size_t u = 0; u < v.units.size(); ++u) v.local_offset[u] = layout.units()[u].offset;
  return v;
}

std::string rank_file_name(int shard_rank, int shard_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank_%05d-of-%05d.safetensors", shard_rank, shard_size);
  return buf;
}

std::string state_tensor_name(StateKind kind, const std::string& unit_name) {
  return kind_prefix(kind) + unit_name;
}

void build_rank_file(const ShardView& view, const float* master, const float* m, const float* v,
                     const std::vector<TensorBytes>& extra, HostBuffer& out) {
  std::vector<TensorBytes> tensors;
  const auto& units = view.layout->units();
  for (auto [kind, base] : {std::pair{StateKind::kMaster, master}, std::pair{StateKind::kExpAvg, m},
                            std::pair{StateKind::kExpAvgSq, v}}) {
    if (!base) continue;
    for (size_t u = 0; u < units.size(); ++u) {
      const int64_t n = view.units[u].valid_numel(view.shard_rank);
      if (n == 0) continue;  // this rank holds only padding of this unit
      tensors.push_back({state_tensor_name(kind, units[u].name), "F32", {n},
                         base + view.local_offset[u], size_t(n) * sizeof(float)});
    }
  }
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  std::map<std::string, std::string> meta = {{"format", "mxtrain-shard"},
                                             {"shard_rank", std::to_string(view.shard_rank)},
                                             {"shard_size", std::to_string(view.shard_size())}};
  build_safetensors(tensors, meta, out);
}

std::string build_manifest(const ManifestInfo& info, const ModelConfig& config,
                           const ParamLayout& layout, const std::vector<FileRecord>& files) {
  nlohmann::ordered_json m;
  m["format_version"] = kCheckpointFormatVersion;
  m["step"] = info.step;
  m["world_size"] = info.world_size;
  m["sharding"] = info.sharding;
  m["shard_size"] = info.shard_size;
  m["optimizer"] = info.has_optimizer;
  m["model"] = nlohmann::ordered_json::parse(hf_config_text(config));
  nlohmann::ordered_json units = nlohmann::ordered_json::array();
  for (const auto& u : layout.units()) {
    nlohmann::ordered_json ts = nlohmann::ordered_json::array();
    for (int ti : u.tensors) {
      const ParamTensor& t = layout.tensors()[size_t(ti)];
      ts.push_back({{"name", t.hf_name}, {"offset", t.offset - u.offset}, {"shape", t.shape}});
    }
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"tensors", ts}});
  }
  m["units"] = units;
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (int r = 0; r < info.shard_size; ++r) {
    ShardView view = shard_view(layout, info.shard_size, r);
    const std::string file = rank_file_name(r, info.shard_size);
    nlohmann::ordered_json slices = nlohmann::ordered_json::array();
    for (size_t u = 0; u < view.units.size(); ++u) {
      const int64_t b = view.units[u].shard_begin(r), n = view.units[u].valid_numel(r);
      slices.push_back({{"unit", u}, {"begin", std::min(b, layout.units()[u].numel)},
                        {"end", std::min(b, layout.units()[u].numel) + n}});
      if (n == 0) continue;
      for (StateKind k : {StateKind::kMaster, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
        if (k != StateKind::kMaster && !info.has_optimizer) continue;
        tensors.push_back({{"file", file},
                           {"name", state_tensor_name(k, layout.units()[u].name)},
                           {"shape", {n}}});
      }
    }
    shards.push_back({{"file", file}, {"shard_rank", r}, {"slices", slices}});
  }
  m["shards"] = shards;
  nlohmann::ordered_json fl = nlohmann::ordered_json::array();
  for (const auto& f : files) {
    nlohmann::ordered_json e = {{"name", f.name}, {"size", f.size}, {"crc32c", crc32c_hex(f.crc32c)}};
    if (!f.etag.empty()) e["etag"] = f.etag;
    fl.push_back(e);
  }
  m["files"] = fl;
  m["tensors"] = tensors;
  return m.dump(1) + "\n";
}

// ---------------------------------------------------------------------------------------------
// Reader

struct CheckpointReader::OpenFile {
  std::string name;
  SafeTensorsIndex index;
  std::map<std::string, const TensorEntry*> by_name;
};

namespace {

// The fields the trainer writes into state.json (train/trainer.cpp), where present, with their
// types and ranges. Returns "" or the reason they are bad.
std::string check_state_fields(const nlohmann::json& j, const std::string& path) {
  auto has = [&](const char* k) { return j.contains(k); };
  // At most 2^48 samples (a run that long would take centuries): the sample index of a resumed
  // step adds to it, so a larger one overflowed int64 in the sampler (an internal error).
  if (has("samples_seen") &&
      !(j["samples_seen"].is_number_integer() && j["samples_seen"].get<int64_t>() >= 0 &&
        j["samples_seen"].get<int64_t>() <= (int64_t{1} << 48)))
    return str(path, ": 'samples_seen' is not an integer in [0, 2^48]");
  for (const char* k : {"data_tokens", "val_tokens"})
    if (has(k) && !(j[k].is_number_integer() && j[k].get<int64_t>() >= 0))
      return str(path, ": '", k, "' is not a non-negative integer");
  if (has("seed") && !j["seed"].is_number_integer())
    return str(path, ": 'seed' is not an integer");
  if (has("world_size") &&
      !(j["world_size"].is_number_integer() && j["world_size"].get<int64_t>() >= 1))
    return str(path, ": 'world_size' is not a positive integer");
  for (const char* k : {"seq_len", "train_windows"})
    if (has(k) && !(j[k].is_number_integer() && j[k].get<int64_t>() >= 1))
      return str(path, ": '", k, "' is not a positive integer");
  if (has("val_fraction") && !j["val_fraction"].is_number())
    return str(path, ": 'val_fraction' is not a number");
  if (has("shuffle") && !j["shuffle"].is_boolean())
    return str(path, ": 'shuffle' is not true or false");
  for (const char* k : {"sharding", "recipe", "data_path", "val_path"})
    if (has(k) && !j[k].is_string()) return str(path, ": '", k, "' is not a string");
  auto lower_hex = [&](const char* k, size_t digits) {
    return j[k].is_string() && j[k].get<std::string>().size() == digits &&
           j[k].get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
  };
  for (const char* k : {"data_fingerprint", "val_fingerprint"})
    if (has(k) && !lower_hex(k, 16))
      return str(path, ": '", k, "' is not 16 lowercase hex digits");
  for (const char* k : {"data_crc32c", "val_crc32c"})
    if (has(k) && !j[k].is_null() && !lower_hex(k, 8))
      return str(path, ": '", k, "' is not null or 8 lowercase hex digits");
  return "";
}

// Parses and checks a manifest's structure. Returns "" or the reason it is bad.
std::string check_manifest(const nlohmann::json& m, const std::string& mpath) {
  if (!m.is_object()) return str(mpath, ": not a JSON object");
  int64_t v = 0, step = 0, shard_size = 0;
  if (!json_int(m, "format_version", &v))
    return str(mpath, ": no integer format_version");
  if (v != kCheckpointFormatVersion)
    return str(mpath, ": format_version ", v, " is not supported (this mxtrain reads ",
               kCheckpointFormatVersion, ")");
  if (!json_int(m, "step", &step) || step < 0) return str(mpath, ": no non-negative integer 'step'");
  if (!json_int(m, "shard_size", &shard_size) || shard_size < 1 || shard_size > 1000000)
    return str(mpath, ": no valid 'shard_size'");
  if (!m.contains("files") || !m["files"].is_array()) return str(mpath, ": no 'files' list");
  std::set<std::string> names;
  for (const auto& f : m["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("crc32c") || !f["crc32c"].is_string())
      return str(mpath, ": a 'files' entry lacks name, size or crc32c");
    std::string name = f["name"].get<std::string>();
    if (!is_plain_file_name(name))
      return str(mpath, ": file name '", name, "' is not a plain file name");
    if (!names.insert(name).second) return str(mpath, ": lists '", name, "' twice");
  }
  for (const char* required : {"config.json", "state.json"})
    if (!names.count(required)) return str(mpath, ": does not list ", required);
  for (int64_t r = 0; r < shard_size; ++r)
    if (!names.count(rank_file_name(int(r), int(shard_size))))
      return str(mpath, ": does not list ", rank_file_name(int(r), int(shard_size)));
  if (!m.contains("units") || !m["units"].is_array() || m["units"].empty())
    return str(mpath, ": no 'units' list");
  for (const auto& u : m["units"]) {
    int64_t numel = 0;
    if (!u.is_object() || !u.contains("name") || !u["name"].is_string() ||
        !json_int(u, "numel", &numel) || numel < 0)
      return str(mpath, ": a 'units' entry lacks name or numel");
  }
  if (!m.contains("model") || !m["model"].is_object()) return str(mpath, ": no 'model' object");
  if (m.contains("tensors")) {
    if (!m["tensors"].is_array()) return str(mpath, ": 'tensors' is not a list");
    for (const auto& t : m["tensors"]) {
      if (!t.is_object() || !t.contains("file") || !t["file"].is_string() ||
          !t.contains("name") || !t["name"].is_string() || !t.contains("shape") ||
          !t["shape"].is_array())
        return str(mpath, ": a 'tensors' entry lacks file, name or shape");
      if (!names.count(t["file"].get<std::string>()))
        return str(mpath, ": tensor in unlisted file '", t["file"].get<std::string>(), "'");
      for (const auto& d : t["shape"])
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          return str(mpath, ": a tensor shape is not non-negative integers");
    }
  }
  return "";
}

// The manifest's descriptive lists (each unit's tensors and offsets, each shard's slices, the
// rank files' tensor list) follow from its model, shard_size and optimizer flag: rebuilt here
// and compared. The reader itself derives the layout from the units' sizes, but other readers
// (tests/python/hf_io.py, anyone reading a checkpoint without mxtrain) trust these lists, so a
// manifest whose lists say otherwise was edited or damaged. Returns "" or why it is bad.
std::string check_derived_lists(const nlohmann::json& m, const std::string& mpath) {
  int64_t world = 0;
  if (!json_int(m, "world_size", &world) || world < 1 || world > 1000000)
    return str(mpath, ": no valid 'world_size' (processes that wrote it)");
  static const std::set<std::string> kShardings = {"full", "grad-op", "none", "hybrid"};
  if (!m.contains("sharding") || !m["sharding"].is_string() ||
      !kShardings.count(m["sharding"].get<std::string>()))
    return str(mpath, ": 'sharding' is not one of full, grad-op, none, hybrid");
  if (m.contains("optimizer") && !m["optimizer"].is_boolean())
    return str(mpath, ": 'optimizer' is not true or false");
  const ModelConfig config = parse_hf_config(m["model"].dump(), mpath + " (model)");
  const ParamLayout layout(config);
  ManifestInfo info;
  info.shard_size = int(m["shard_size"].get<int64_t>());
  info.has_optimizer = m.value("optimizer", true);
  auto mismatch = [&](const char* key) {
    return str(mpath, ": its '", key, "' list does not match its model, shard_size and ",
               "optimizer flag (edited or damaged)");
  };
  // The lists' lengths first: the rebuilt manifest has shard_size x units slices, so a 15 KB
  // manifest naming 4096 layers and 200 shards had 3 GB built before any comparison. With
  // these lengths checked, what is built is no larger than the manifest itself.
  const size_t n_units = layout.units().size();
  if (m["units"].size() != n_units) return mismatch("units");
  if (!m.contains("shards") || !m["shards"].is_array() ||
      m["shards"].size() != size_t(info.shard_size))
    return mismatch("shards");
  for (const auto& sh : m["shards"])
    if (!sh.is_object() || !sh.contains("slices") || !sh["slices"].is_array() ||
        sh["slices"].size() != n_units)
      return mismatch("shards");
  const nlohmann::json want = nlohmann::json::parse(build_manifest(info, config, layout, {}));
  for (const char* key : {"units", "shards", "tensors"})
    if (!m.contains(key) || m[key] != want[key]) return mismatch(key);
  return "";
}

nlohmann::json read_manifest(CheckpointStore& store, int64_t step) {
  const std::string mpath = store.step_location(step) + "/" + kManifest;
  std::string text = store.read_small(step, kManifest, kMaxManifestBytes);
  std::string bad;
  nlohmann::json m = parse_json_input(text, &bad);
  MX_REQUIRE(!m.is_discarded(), mpath, " ", bad);
  std::string why = check_manifest(m, mpath);
  MX_REQUIRE(why.empty(), why);
  why = check_derived_lists(m, mpath);
  MX_REQUIRE(why.empty(), why);
  return m;
}

}  // namespace

CheckpointReader::CheckpointReader(CheckpointStore& store, int64_t step)
    : store_(store), step_(step) {
  manifest_ = read_manifest(store, step);
  MX_REQUIRE(manifest_["step"].get<int64_t>() == step, location(), "/manifest.json says step ",
             manifest_["step"].get<int64_t>());
  shard_size_ = int(manifest_["shard_size"].get<int64_t>());
  has_optimizer_ = manifest_.value("optimizer", true);
  for (const auto& u : manifest_["units"]) {
    unit_names_.push_back(u["name"].get<std::string>());
    units_.push_back(make_shard_layout(u["numel"].get<int64_t>(), shard_size_));
  }
  files_.resize(size_t(shard_size_));
}

CheckpointReader::~CheckpointReader() = default;

int CheckpointReader::world_size() const { return int(manifest_.value("world_size", int64_t(1))); }

ModelConfig CheckpointReader::model_config() const {
  return parse_hf_config(manifest_["model"].dump(), location() + "/manifest.json (model)");
}

nlohmann::json CheckpointReader::state() const {
  const std::string p = location() + "/state.json";
  std::string bad;
  nlohmann::json j = parse_json_input(store_.read_small(step_, "state.json", kMaxSmallFileBytes),
                                      &bad);
  MX_REQUIRE(!j.is_discarded(), p, " ", bad);
  MX_REQUIRE(j.is_object(), p, " is not a JSON object");
  MX_REQUIRE(j.contains("step") && j["step"].is_number_integer() &&
                 j["step"].get<int64_t>() == step_,
             p, " does not hold step ", step_);
  const std::string why = check_state_fields(j, p);
  MX_REQUIRE(why.empty(), why);
  return j;
}

void CheckpointReader::check_layout(const ParamLayout& layout) const {
  const auto& units = layout.units();
  const auto& mu = manifest_["units"];
  MX_REQUIRE(mu.size() == units.size(), "checkpoint ", location(), " has ", mu.size(),
             " units, this model ", units.size(), ": it holds a different model");
  for (size_t u = 0; u < units.size(); ++u) {
    MX_REQUIRE(mu[u]["name"].get<std::string>() == units[u].name &&
                   mu[u]["numel"].get<int64_t>() == units[u].numel,
               "checkpoint ", location(), ": unit ", u, " is ", mu[u]["name"].get<std::string>(),
               " of ", mu[u]["numel"].get<int64_t>(), " elements, this model's is ",
               units[u].name, " of ", units[u].numel, ": it holds a different model");
  }
}

CheckpointReader::OpenFile& CheckpointReader::file(int shard_rank) {
  auto& slot = files_[size_t(shard_rank)];
  if (slot) return *slot;
  auto f = std::make_unique<OpenFile>();
  f->name = rank_file_name(shard_rank, shard_size_);
  const std::string label = location() + "/" + f->name;
  auto st = store_.stat(step_, f->name);
  MX_REQUIRE(st.has_value(), label, ": missing");
  MX_REQUIRE(st->size >= 8, label, ": ", st->size, " bytes, too short for a safetensors file");
  uint64_t header_len = 0;
  store_.read_range(step_, f->name, 0, 8, &header_len);
  MX_REQUIRE(header_len <= st->size - 8 && header_len <= 100'000'000, label, ": header length ",
             header_len, " does not fit the file's ", st->size, " bytes");
  std::string header(size_t(header_len), '\0');
  store_.read_range(step_, f->name, 8, header_len, header.data());
  f->index = parse_safetensors_header(label, header.data(), header_len, header_len, st->size);
  for (const auto& e : f->index.tensors) f->by_name[e.name] = &e;
  slot = std::move(f);
  return *slot;
}

void CheckpointReader::read(int unit, StateKind kind, int64_t begin, int64_t end, float* dst) {
  MX_REQUIRE(unit >= 0 && size_t(unit) < units_.size(), "checkpoint unit ", unit, " out of range");
  const ShardLayout& sl = units_[size_t(unit)];
  MX_REQUIRE(0 <= begin && begin <= end && end <= sl.numel, "checkpoint read [", begin, ", ", end,
             ") outside unit ", unit_names_[size_t(unit)], " of ", sl.numel);
  const std::string name = state_tensor_name(kind, unit_names_[size_t(unit)]);
  for (const ShardSlice& s : shard_slices(sl, begin, end)) {
    OpenFile& f = file(s.rank);
    auto it = f.by_name.find(name);
    const std::string label = location() + "/" + f.name;
    MX_REQUIRE(it != f.by_name.end(), label, " lacks tensor ", name);
    const TensorEntry& e = *it->second;
    MX_REQUIRE(e.dtype == "F32" && e.shape.size() == 1 && e.shape[0] == sl.valid_numel(s.rank),
               label, ": ", name, " is not F32 [", sl.valid_numel(s.rank), "]");
    float* out = dst + (s.global_begin - begin);
    store_.read_range(step_, f.name,
                      f.index.data_start + e.begin + uint64_t(s.local_begin) * sizeof(float),
                      uint64_t(s.numel) * sizeof(float), out);
    // A NaN or infinity here (a bit flip whose CRC32C was rewritten, a run saved as it
    // diverged) was reported steps later as "training diverged", or generated garbage; a
    // negative second moment makes its square root NaN at the next update.
    for (int64_t i = 0; i < s.numel; ++i)
      MX_REQUIRE(std::isfinite(out[i]) && !(kind == StateKind::kExpAvgSq && out[i] < 0.0f),
                 label, ": ", name, " holds ", out[i], " at element ", s.local_begin + i,
                 kind == StateKind::kExpAvgSq ? " (a second moment must be finite and >= 0)"
                                              : " (every value must be finite)");
  }
}

std::optional<std::vector<float>> CheckpointReader::read_extra(int shard_rank,
                                                               const std::string& name) {
  OpenFile& f = file(shard_rank);
  auto it = f.by_name.find(name);
  if (it == f.by_name.end()) return std::nullopt;
  const TensorEntry& e = *it->second;
  MX_REQUIRE(e.dtype == "F32" && e.shape.size() == 1, location(), "/", f.name, ": ", name,
             " is not a 1-D F32 tensor (as mxtrain writes its extra tensors)");
  std::vector<float> out(size_t(e.numel()));
  store_.read_range(step_, f.name, f.index.data_start + e.begin, e.end - e.begin, out.data());
  return out;
}

const SafeTensorsIndex& CheckpointReader::index(int shard_rank) { return file(shard_rank).index; }

std::vector<std::string> CheckpointReader::extra_names(int shard_rank) {
  std::vector<std::string> out;
  for (const auto& e : file(shard_rank).index.tensors)
    if (e.name.rfind("master.", 0) != 0 && e.name.rfind("exp_avg.", 0) != 0 &&
        e.name.rfind("exp_avg_sq.", 0) != 0)
      out.push_back(e.name);
  return out;
}

void load_shards(CheckpointReader& reader, const ShardView& view, float* master, float* m,
                 float* v, bool stoppable) {
  reader.check_layout(*view.layout);
  MX_REQUIRE(!(m || v) || reader.has_optimizer(), "checkpoint ", reader.location(),
             " holds no optimizer state");
  // Minutes for a large model from S3: progress lines, and a stop ends the load between
  // tensors (core/load_progress.h).
  const int kinds = 1 + (m ? 1 : 0) + (v ? 1 : 0);
  int64_t total = 0;
  for (size_t u = 0; u < view.units.size(); ++u)
    total += view.units[u].valid_numel(view.shard_rank) * kinds * int64_t(sizeof(float));
  LoadProgress progress("checkpoint: loading " + reader.location(), total, stoppable);
  for (size_t u = 0; u < view.units.size(); ++u) {
    const ShardLayout& sl = view.units[u];
    const int64_t begin = std::min(sl.shard_begin(view.shard_rank), sl.numel);
    const int64_t n = sl.valid_numel(view.shard_rank);
    for (auto [kind, base] : {std::pair{StateKind::kMaster, master},
                              std::pair{StateKind::kExpAvg, m}, std::pair{StateKind::kExpAvgSq, v}}) {
      if (!base) continue;
      progress.before_piece();
      float* dst = base + view.local_offset[u];
      if (n > 0) reader.read(int(u), kind, begin, begin + n, dst);
      std::fill(dst + n, dst + sl.shard_numel, 0.0f);  // padding
      progress.after_piece(n * int64_t(sizeof(float)));
    }
  }
}

std::string delayed_state_problem(const std::string& name, const std::vector<float>* values,
                                  int64_t num_layers, int64_t* layer_out, int* linear_out,
                                  int* op_out) {
  if (name.rfind("recipe.delayed.", 0) != 0) return "";
  long long layer = 0;
  int linear = 0, op = 0, consumed = 0;
  if (!(std::sscanf(name.c_str(), "recipe.delayed.%lld.%d.%d%n", &layer, &linear, &op,
                    &consumed) == 3 &&
        size_t(consumed) == name.size() && layer >= 0 && layer < num_layers && linear >= 0 &&
        linear < 7 && op >= 0 && op < 6))
    return str(name, " names no operand of this model's Linears (recipe.delayed.LAYER.LINEAR.",
               "OPERAND: layer < ", num_layers, ", linear < 7, operand < 6)");
  // Spelled as mxtrain writes it: sscanf also reads "+1", " 1" and "01", so two names could
  // feed one operand (the second silently replacing the first) while another had none.
  if (name != str("recipe.delayed.", layer, ".", linear, ".", op))
    return str(name, " is not spelled as mxtrain writes it (recipe.delayed.", layer, ".", linear,
               ".", op, ": decimal, no sign, spaces or leading zeros)");
  if (!values || values->size() != 1 + size_t(numerics::kAmaxHistoryLen))
    return str(name, " holds ", values ? int64_t(values->size()) : 0, " values, not a scale and an ",
               "amax history of ", numerics::kAmaxHistoryLen);
  // A scale whose reciprocal is not finite (0, a subnormal) dequantizes to infinities.
  const float scale = (*values)[0];
  if (!(scale > 0.0f && std::isfinite(scale) && std::isfinite(1.0f / scale)))
    return str(name, ": FP8 scale ", scale, " is not a positive number with a finite reciprocal");
  for (size_t i = 1; i < values->size(); ++i)
    if (!((*values)[i] >= 0.0f && std::isfinite((*values)[i])))
      return str(name, ": amax ", (*values)[i], " is not a finite non-negative number");
  if (layer_out) *layer_out = layer;
  if (linear_out) *linear_out = linear;
  if (op_out) *op_out = op;
  return "";
}

// ---------------------------------------------------------------------------------------------
// Verification, retention, resolving locations

std::string verify_checkpoint(CheckpointStore& store, int64_t step, bool read_all) {
  const std::string loc = store.step_location(step);
  const std::string mpath = loc + "/" + kManifest;
  nlohmann::json m;
  try {
    if (!store.stat(step, kManifest)) return str(mpath, ": missing (not committed)");
    m = read_manifest(store, step);
  } catch (const StorageError&) {
    throw;  // the store failed (after its retries), not the checkpoint: exit 3
  } catch (const std::exception& e) {
    return e.what();
  }
  if (m["step"].get<int64_t>() != step) return str(mpath, ": says step ", m["step"].get<int64_t>());
  if (!store.is_s3()) read_all = true;

  // Sizes (and ETags) first: cheap, and before anything is read.
  for (const auto& f : m["files"]) {
    const std::string name = f["name"].get<std::string>();
    const std::string p = loc + "/" + name;
    std::optional<StoredFile> st;
    try {
      st = store.stat(step, name);
    } catch (const StorageError&) {
      throw;  // the store failed (after its retries), not the checkpoint: exit 3
    } catch (const std::exception& e) {
      return str(p, ": ", e.what());
    }
    if (!st) return str(p, ": missing");
    if (st->size != f["size"].get<uint64_t>())
      return str(p, ": size ", st->size, " bytes, manifest says ", f["size"].get<uint64_t>());
    if (store.is_s3() && f.contains("etag") && f["etag"].is_string() &&
        f["etag"].get<std::string>() != st->etag)
      return str(p, ": ETag ", st->etag, ", manifest says ", f["etag"].get<std::string>(),
                 " (the object was replaced)");
  }
  if (read_all) {
    for (const auto& f : m["files"]) {
      const std::string name = f["name"].get<std::string>();
      uint32_t crc = 0;
      FiniteScan scan(name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0,
                      f["size"].get<uint64_t>());
      try {
        store.read_stream(step, name, [&](const uint8_t* p, size_t n) {
          crc = crc32c_update(crc, p, n);
          scan.feed(p, n);
        });
      } catch (const StorageError&) {
        throw;  // the store failed (after its retries), not the checkpoint: exit 3
      } catch (const std::exception& e) {
        return str(loc, "/", name, ": ", e.what());
      }
      if (crc32c_hex(crc) != f["crc32c"].get<std::string>())
        return str(loc, "/", name, ": CRC32C ", crc32c_hex(crc), ", manifest says ",
                   f["crc32c"].get<std::string>(), " (corrupt)");
      if (scan.bad_element >= 0)
        return str(loc, "/", name, ": ", scan.bad_tensor, " holds ", scan.bad_value, " at element ",
                   scan.bad_element,
                   scan.bad_nonneg ? " (a second moment must be finite and >= 0)"
                                   : " (every value must be finite)");
    }
  }
  // Every rank file parses and holds the tensors the manifest lists, with their shapes.
  try {
    CheckpointReader reader(store, step);
    const ModelConfig model = reader.model_config();
    const nlohmann::json state = reader.state();  // state.json: its step, its fields' types
    // The three descriptions of one run must agree: state.json's process count and sharding
    // with the manifest's, and the step's config.json (what Hugging Face tools read) with the
    // manifest's model (what mxtrain reads): an edit to one side alone changed the exported
    // model (rope_theta, rms_norm_eps) while the step verified.
    for (const char* key : {"world_size", "sharding"})
      if (state.contains(key) && state[key] != m[key])
        return str(loc, "/state.json: ", key, " ", state[key].dump(), ", manifest.json says ",
                   m[key].dump());
    for (const auto& f : m["files"]) {
      if (f["name"] != "config.json") continue;
      const std::string cpath = loc + "/config.json";
      const ModelConfig described =
          parse_hf_config(store.read_small(step, "config.json", kMaxSmallFileBytes), cpath);
      if (hf_config_text(described) != hf_config_text(model))
        return str(cpath, ": describes another model than manifest.json's 'model'");
    }
    for (int r = 0; r < reader.shard_size(); ++r) {
      const std::string file = rank_file_name(r, reader.shard_size());
      std::vector<std::string> extras;
      try {
        extras = reader.extra_names(r);  // opens and parses the header
      } catch (const StorageError&) {
        throw;  // the store failed (after its retries), not the checkpoint: exit 3
      } catch (const std::exception& e) {
        return str(loc, "/", file, ": does not parse: ", e.what());
      }
      // fp8-delayed's state as resuming reads it (a few floats a Linear): a step resume
      // refuses must not verify, or resume = auto would stop on it instead of skipping it.
      for (const std::string& name : extras) {
        if (name.rfind("recipe.delayed.", 0) != 0) continue;
        std::optional<std::vector<float>> values;
        try {
          values = reader.read_extra(r, name);
        } catch (const StorageError&) {
          throw;
        } catch (const std::exception& e) {  // not a 1-D F32 tensor: a verdict, not a failure
          return e.what();
        }
        const std::string why = delayed_state_problem(
            name, values ? &*values : nullptr, model.num_hidden_layers);
        if (!why.empty()) return str(loc, "/", file, ": ", why);
      }
    }
    // Every tensor the manifest lists is in its file with that shape.
    std::map<std::string, int> rank_of;
    for (int r = 0; r < reader.shard_size(); ++r)
      rank_of[rank_file_name(r, reader.shard_size())] = r;
    for (const auto& t : m.value("tensors", nlohmann::json::array())) {
      const std::string file = t["file"].get<std::string>(), name = t["name"].get<std::string>();
      auto it = rank_of.find(file);
      if (it == rank_of.end()) continue;
      const auto& tensors = reader.index(it->second).tensors;
      auto e = std::find_if(tensors.begin(), tensors.end(),
                            [&](const TensorEntry& x) { return x.name == name; });
      if (e == tensors.end()) return str(loc, "/", file, ": lacks tensor ", name);
      std::vector<int64_t> shape;
      for (const auto& d : t["shape"]) shape.push_back(d.get<int64_t>());
      if (e->shape != shape) return str(loc, "/", file, ": ", name, " has the wrong shape");
      if (e->dtype != "F32")  // every checkpoint tensor is F32 (docs/checkpoints.md)
        return str(loc, "/", file, ": ", name, " is ", e->dtype, ", not F32");
    }
  } catch (const StorageError&) {
    throw;  // the store failed (after its retries), not the checkpoint: exit 3
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

int64_t latest_verified_step(CheckpointStore& store, bool report, bool read_all) {
  auto steps = store.committed_steps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    std::string why = verify_checkpoint(store, *it, read_all);
    if (why.empty()) return *it;
    if (report)
      warn(str("skipping checkpoint ", store.step_location(*it), ", which does not verify: ", why));
  }
  return -1;
}

void prune_checkpoints(CheckpointStore& store, int64_t keep, int64_t newest) {
  if (keep <= 0) return;
  std::vector<int64_t> steps;
  for (int64_t s : store.committed_steps())
    if (s <= newest) steps.push_back(s);  // above it: not this run's (a junk or corrupt step)
  // A step that cannot be deleted stays, with a warning: failing here would stop the run and
  // lose its later steps over old data. That is any failure of the deletes themselves: a
  // storage error, and S3's refusals too (403 from Object Lock or a policy denying deletes, a
  // UserError elsewhere, ended the run with exit 2). Configuration errors show earlier (the
  // listing above, the uploads of the step just committed) and still stop the run.
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i) {
    try {
      store.remove_step(steps[i]);
    } catch (const StorageError& e) {
      warn(str("checkpoint.keep: ", e.what(), " (it stays; training goes on)"));
    } catch (const UserError& e) {
      warn(str("checkpoint.keep: ", e.what(), " (it stays; training goes on)"));
    }
  }
}

ResolvedCheckpoint resolve_checkpoint(const std::string& location, bool read_all) {
  CheckpointLocation loc = parse_checkpoint_location(location);
  ResolvedCheckpoint r;
  r.store = open_checkpoint_store(loc.root);
  if (!r.store->is_s3()) {
    std::error_code ec;
    MX_REQUIRE(std::filesystem::exists(location, ec), "checkpoint ", location, " does not exist");
  }
  if (loc.step >= 0) {
    r.step = loc.step;
    MX_REQUIRE(r.store->stat(r.step, kManifest).has_value(), "checkpoint ", location,
               " is not committed (no manifest.json)");
  } else {
    auto steps = r.store->committed_steps();
    MX_REQUIRE(!steps.empty(), location, " is neither a checkpoint step (", "step_NNNNNNNN) nor a ",
               "location holding committed steps (step_NNNNNNNN/manifest.json)");
    r.step = steps.back();
  }
  std::string why = verify_checkpoint(*r.store, r.step, read_all);
  MX_REQUIRE(why.empty(), "checkpoint ", r.store->step_location(r.step), " does not verify: ", why);
  return r;
}

ModelConfig load_checkpoint_weights(const std::string& location, std::vector<float>& params,
                                    std::string* step_location) {
  ResolvedCheckpoint rc = resolve_checkpoint(location);
  CheckpointReader reader(*rc.store, rc.step);
  ModelConfig cfg = reader.model_config();
  ParamLayout layout(cfg);
  params.assign(size_t(layout.total_numel()), 0.0f);
  load_shards(reader, whole_model_view(layout), params.data(), nullptr, nullptr);
  if (step_location) *step_location = reader.location();
  return cfg;
}

}  // namespace mx
