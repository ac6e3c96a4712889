// `mxtrain sweep`: the parts that do not run anything. A grid (`--grid key=v1,v2`, repeated)
// expands to the cartesian product of its values; each point gets a stable id (its run
// directory's name), and the points' results are written as CSV, JSON and Markdown tables.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mx::plan {

struct GridAxis {
  std::string key;                  // section.key
  std::vector<std::string> values;  // in the order given
};

// "train.micro_batch=2,4,8" -> {key, values}. UserError for bad syntax (no '=', no section,
// an empty value).
GridAxis parse_grid_axis(const std::string& spec);
// Every --grid; UserError for none or for a key given twice.
std::vector<GridAxis> parse_grid(const std::vector<std::string>& specs);

struct GridPoint {
  std::string id;  // e.g. "micro_batch-2_activation_checkpointing-full"
  std::vector<std::pair<std::string, std::string>> overrides;  // key, value (axis order)
};

// Ids longer than this are cut and end in '-' and 16 hex digits of a hash of the point's
// values; numbering apart equal ids ("-2", "-3") may add a few bytes. Far below NAME_MAX (255).
inline constexpr size_t kMaxPointIdBytes = 200;

// A sweep trains every point; more than this is a typing mistake (or would take years).
inline constexpr uint64_t kMaxGridPoints = 10000;

// The number of points, the product of the axes' value counts; UserError (naming the counts)
// above kMaxGridPoints, computed without overflow. expand_grid calls it first.
uint64_t grid_size(const std::vector<GridAxis>& axes);

// The cartesian product, the first axis varying slowest.
std::vector<GridPoint> expand_grid(const std::vector<GridAxis>& axes);

// One point's outcome. status: "ok", "failed: <message>" or
// "skipped: predicted OOM (needs X > Y)".
struct SweepResult {
  GridPoint point;
  std::string status;
  bool reused = false;  // read back from an earlier sweep into the same directory
  double predicted_mem_bytes = 0, capacity_bytes = 0;
  double predicted_tokens_per_s = 0, predicted_mfu = 0;
  bool measured = false;  // the run finished and its summary was read
  double tokens_per_s = 0, peak_mem_bytes = 0, final_loss = 0, mfu = 0;
  double wall_s = 0;
  std::string run_dir;
};

nlohmann::json result_to_json(const SweepResult& r);
SweepResult result_from_json(const nlohmann::json& j);  // throws nlohmann exceptions if malformed

// Measured runs by tokens/s (highest first), then failed, then skipped; ties by id.
void sort_results(std::vector<SweepResult>& results);

std::string results_csv(const std::vector<SweepResult>& results);
std::string results_markdown(const std::vector<SweepResult>& results,
                             const std::string& title);

}  // namespace mx::plan
