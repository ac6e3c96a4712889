#include "plan/sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fnv1a.h"

namespace mx::plan {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string unquote(const std::string& v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
    return v.substr(1, v.size() - 2);
  return v;
}

// A value as a piece of a directory name: letters, digits, '.', '-'; anything else -> '_'.
std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-';
    out += ok ? c : '_';
  }
  return out.empty() ? "_" : out;
}

std::string last_part(const std::string& key) {
  const auto p = key.rfind('.');
  return p == std::string::npos ? key : key.substr(p + 1);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string mib(double bytes) { return fmt("%.1f", bytes / (1024.0 * 1024.0)); }

std::string human_rate(double v) {
  if (v >= 1e6) return fmt("%.2fM", v / 1e6);
  if (v >= 1e3) return fmt("%.2fk", v / 1e3);
  return fmt("%.3g", v);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt("%.0f", v);
  return fmt("%.6g", v);
}

int rank_of(const SweepResult& r) {
  if (r.measured) return 0;
  if (r.status.rfind("failed", 0) == 0) return 1;
  return 2;
}

}  // namespace

GridAxis parse_grid_axis(const std::string& spec) {
  const auto eq = spec.find('=');
  MX_REQUIRE(eq != std::string::npos,
             "--grid '", spec, "': expected section.key=v1,v2,... (no '=')");
  GridAxis axis;
  axis.key = trim(spec.substr(0, eq));
  MX_REQUIRE(!axis.key.empty() && axis.key.find('.') != std::string::npos &&
                 axis.key.front() != '.' && axis.key.back() != '.',
             "--grid '", spec, "': the key must be section.key (e.g. train.micro_batch)");
  std::set<std::string> seen;
  std::string rest = spec.substr(eq + 1);
  MX_REQUIRE(!trim(rest).empty(), "--grid '", spec, "': no values after '='");
  size_t start = 0;
  while (true) {
    const auto comma = rest.find(',', start);
    const std::string v = trim(rest.substr(start, comma == std::string::npos ? std::string::npos
                                                                              : comma - start));
    MX_REQUIRE(!v.empty(), "--grid '", spec, "': empty value (values are separated by single "
               "commas)");
    MX_REQUIRE(seen.insert(unquote(v)).second, "--grid '", spec, "': value '", v,
               "' is given twice");
    axis.values.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return axis;
}

std::vector<GridAxis> parse_grid(const std::vector<std::string>& specs) {
  MX_REQUIRE(!specs.empty(), "sweep needs at least one --grid section.key=v1,v2,...");
  std::vector<GridAxis> axes;
  std::set<std::string> keys;
  for (const auto& s : specs) {
    GridAxis a = parse_grid_axis(s);
    MX_REQUIRE(keys.insert(a.key).second, "--grid: key '", a.key, "' is given twice");
    axes.push_back(std::move(a));
  }
  return axes;
}

uint64_t grid_size(const std::vector<GridAxis>& axes) {
  uint64_t n = 1;
  std::string counts;
  bool over = false;
  for (const auto& a : axes) {
    counts += (counts.empty() ? "" : " x ") + std::to_string(a.values.size());
    // Once above the cap the product only grows (every axis has at least one value).
    if (!over && (__builtin_mul_overflow(n, uint64_t(a.values.size()), &n) || n > kMaxGridPoints))
      over = true;
  }
  MX_REQUIRE(!over, "--grid: ", counts, " values make more than ", kMaxGridPoints,
             " points, the most a sweep runs (each point is a training run)");
  return n;
}

std::vector<GridPoint> expand_grid(const std::vector<GridAxis>& axes) {
  grid_size(axes);  // before anything is allocated
  // Ids use the key's last part unless two axes share it.
  std::vector<std::string> names;
  for (const auto& a : axes) {
    int same = 0;
    for (const auto& b : axes) same += last_part(a.key) == last_part(b.key);
    names.push_back(sanitize(same > 1 ? a.key : last_part(a.key)));
  }
  std::vector<GridPoint> points(1);
  for (size_t i = 0; i < axes.size(); ++i) {
    std::vector<GridPoint> next;
    for (const auto& p : points) {
      for (const auto& v : axes[i].values) {
        GridPoint q = p;
        q.overrides.emplace_back(axes[i].key, v);
        q.id += (q.id.empty() ? "" : "_") + names[i] + "-" + sanitize(unquote(v));
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  // An id is a directory name: one past NAME_MAX (255 bytes) cannot be created (a 250-byte
  // data.path value made the run directory, then its result file, "File name too long" after
  // the points before it had trained). A long id keeps its first bytes and ends in a hash of
  // the point's keys and values as given, so it stays the same from sweep to sweep.
  for (auto& p : points) {
    if (p.id.size() <= kMaxPointIdBytes) continue;
    std::string given;
    for (const auto& [k, v] : p.overrides) given += k + "=" + v + "\n";
    const uint64_t h = fnv1a64(given);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    p.id = p.id.substr(0, kMaxPointIdBytes - 17) + "-" + hex;
  }
  // Sanitizing can make two ids equal ("a b" and "a_b"): number them apart.
  std::set<std::string> ids;
  for (auto& p : points) {
    std::string id = p.id;
    for (int k = 2; !ids.insert(id).second; ++k) id = p.id + "-" + std::to_string(k);
    p.id = id;
  }
  return points;
}

nlohmann::json result_to_json(const SweepResult& r) {
  nlohmann::json ov = nlohmann::json::object();
  nlohmann::json order = nlohmann::json::array();
  for (const auto& [k, v] : r.point.overrides) {
    ov[k] = v;
    order.push_back(k);
  }
  nlohmann::json j = {
      {"id", r.point.id},
      {"overrides", ov},
      {"override_order", order},
      {"status", r.status},
      {"predicted_mem_bytes", r.predicted_mem_bytes},
      {"capacity_bytes", r.capacity_bytes},
      {"predicted_tokens_per_s", r.predicted_tokens_per_s},
      {"predicted_mfu", r.predicted_mfu},
      {"run_dir", r.run_dir},
      {"wall_s", r.wall_s},
      {"reused", r.reused},
  };
  if (r.measured) {
    j["tokens_per_s"] = r.tokens_per_s;
    j["peak_mem_bytes"] = r.peak_mem_bytes;
    j["final_loss"] = r.final_loss;
    j["mfu"] = r.mfu;
    j["mem_error"] = r.predicted_mem_bytes > 0
                         ? (r.peak_mem_bytes - r.predicted_mem_bytes) / r.predicted_mem_bytes
                         : 0.0;
  } else {
    for (const char* k : {"tokens_per_s", "peak_mem_bytes", "final_loss", "mfu", "mem_error"})
      j[k] = nullptr;
  }
  return j;
}

SweepResult result_from_json(const nlohmann::json& j) {
  SweepResult r;
  r.point.id = j.at("id").get<std::string>();
  for (const auto& k : j.at("override_order"))
    r.point.overrides.emplace_back(k.get<std::string>(),
                                   j.at("overrides").at(k.get<std::string>()).get<std::string>());
  r.status = j.at("status").get<std::string>();
  r.predicted_mem_bytes = j.at("predicted_mem_bytes").get<double>();
  r.capacity_bytes = j.at("capacity_bytes").get<double>();
  r.predicted_tokens_per_s = j.at("predicted_tokens_per_s").get<double>();
  r.predicted_mfu = j.at("predicted_mfu").get<double>();
  r.run_dir = j.value("run_dir", "");
  r.wall_s = j.value("wall_s", 0.0);
  r.measured = !j.at("tokens_per_s").is_null();
  if (r.measured) {
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.peak_mem_bytes = j.at("peak_mem_bytes").get<double>();
    r.final_loss = j.at("final_loss").get<double>();
    r.mfu = j.at("mfu").get<double>();
  }
  return r;
}

void sort_results(std::vector<SweepResult>& results) {
  std::stable_sort(results.begin(), results.end(), [](const SweepResult& a, const SweepResult& b) {
    if (rank_of(a) != rank_of(b)) return rank_of(a) < rank_of(b);
    if (a.measured && a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.point.id < b.point.id;
  });
}

std::string results_csv(const std::vector<SweepResult>& results) {
  // Fields joined by commas (built field by field: GCC 12 warns, wrongly, on "," + string).
  std::string out;
  auto row = [&out](const std::vector<std::string>& fields) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) out += ',';
      out += fields[i];
    }
    out += '\n';
  };
  std::vector<std::string> head = {"id"};
  if (!results.empty())
    for (const auto& kv : results.front().point.overrides) head.push_back(csv_field(kv.first));
  for (const char* f : {"status", "tokens_per_s", "predicted_tokens_per_s", "peak_mem_bytes",
                        "predicted_mem_bytes", "mem_error", "capacity_bytes", "final_loss", "mfu",
                        "predicted_mfu", "wall_s", "reused"})
    head.emplace_back(f);
  row(head);
  for (const auto& r : results) {
    const auto m = [&](double v) { return r.measured ? num(v) : std::string(); };
    std::vector<std::string> f = {csv_field(r.point.id)};
    for (const auto& kv : r.point.overrides) f.push_back(csv_field(unquote(kv.second)));
    f.push_back(csv_field(r.status));
    f.push_back(m(r.tokens_per_s));
    f.push_back(num(r.predicted_tokens_per_s));
    f.push_back(m(r.peak_mem_bytes));
    f.push_back(num(r.predicted_mem_bytes));
    f.push_back(r.measured && r.predicted_mem_bytes > 0
                    ? fmt("%.6g", (r.peak_mem_bytes - r.predicted_mem_bytes) /
                                      r.predicted_mem_bytes)
                    : std::string());
    f.push_back(num(r.capacity_bytes));
    f.push_back(m(r.final_loss));
    f.push_back(m(r.mfu));
    f.push_back(num(r.predicted_mfu));
    f.push_back(fmt("%.2f", r.wall_s));
    f.push_back(r.reused ? "true" : "false");
    row(f);
  }
  return out;
}

std::string results_markdown(const std::vector<SweepResult>& results, const std::string& title) {
  std::vector<std::string> keys;
  if (!results.empty())
    for (const auto& kv : results.front().point.overrides) keys.push_back(kv.first);
  std::string out = "# " + title + "\n\n";
  out += "Sorted by measured tokens/s (failed and skipped points last). Memory is per process, "
         "MiB; error = (measured - predicted) / predicted.\n\n|";
  for (const auto& k : keys) {
    out += ' ';
    out += k;
    out += " |";
  }
  out += " tokens/s | predicted tokens/s | measured peak MiB | predicted MiB | mem error | "
         "final loss | MFU | status |\n|";
  for (size_t i = 0; i < keys.size() + 8; ++i) out += "---|";
  out += "\n";
  for (const auto& r : results) {
    std::vector<std::string> cells;
    for (const auto& kv : r.point.overrides) cells.push_back(unquote(kv.second));
    const std::string dash = "-";
    cells.push_back(r.measured ? human_rate(r.tokens_per_s) : dash);
    cells.push_back(human_rate(r.predicted_tokens_per_s));
    cells.push_back(r.measured ? mib(r.peak_mem_bytes) : dash);
    cells.push_back(mib(r.predicted_mem_bytes));
    cells.push_back(r.measured && r.predicted_mem_bytes > 0
                        ? fmt("%+.2f%%", 100.0 * (r.peak_mem_bytes - r.predicted_mem_bytes) /
                                             r.predicted_mem_bytes)
                        : dash);
    cells.push_back(r.measured ? fmt("%.4f", r.final_loss) : dash);
    cells.push_back(r.measured ? fmt("%.1f%%", 100.0 * r.mfu) : dash);
    cells.push_back(r.status);
    out += '|';
    for (const auto& c : cells) {
      out += ' ';
      out += c;
      out += " |";
    }
    out += '\n';
  }
  return out;
}

}  // namespace mx::plan
