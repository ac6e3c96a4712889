// The sharded checkpoint format: files written by S ranks and read back by M ranks must give
// every rank exactly its slice of the full state (checked against the full buffers the shards
// were cut from), locations parse as users write them, and damaged steps do not verify.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <random>

#include "checkpoint/sharded.h"
#include "checkpoint/storage.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"

using namespace mx;
namespace fs = std::filesystem;

namespace {

ModelConfig odd_model() {
  ModelConfig c = model_preset("tiny");
  c.hidden_size = 24;  // odd unit sizes, so shards of 3 ranks get padding
  c.head_dim = 6;
  c.intermediate_size = 37;
  c.vocab_size = 259;
  c.finalize();
  return c;
}

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// Writes a committed step with `S` shard files cut from full buffers by index arithmetic.
void write_step(CheckpointStore& store, int64_t step, const ModelConfig& cfg,
                const ParamLayout& layout, int S, const std::vector<float>* full[3]) {
  std::vector<FileRecord> files;
  for (int r = 0; r < S; ++r) {
    ShardView view = shard_view(layout, S, r);
    std::vector<float> local[3];
    for (int k = 0; k < 3; ++k) {
      local[k].assign(size_t(view.local_numel()), -1.0f);  // padding must not be read
      for (size_t u = 0; u < view.units.size(); ++u) {
        const auto& sl = view.units[u];
        for (int64_t i = 0; i < sl.valid_numel(r); ++i)
          local[k][size_t(view.local_offset[u] + i)] =
              (*full[k])[size_t(layout.units()[u].offset + sl.shard_begin(r) + i)];
      }
    }
    HostBuffer bytes;
    std::vector<float> extra = {float(r), 1.5f};
    build_rank_file(view, local[0].data(), local[1].data(), local[2].data(),
                    {{"recipe.test", "F32", {2}, extra.data(), 8}}, bytes);
    StoredFile f = store.write_file(step, rank_file_name(r, S), bytes.data(), bytes.size());
    files.push_back({f.name, f.size, 0, ""});
  }
  // CRCs are not needed to read; verify() is tested on real runs (tests/python).
  for (const char* name : {"config.json", "state.json"}) {
    std::string text = std::string("{\"step\": ") + std::to_string(step) + "}";
    StoredFile f = store.write_file(step, name, text.data(), text.size());
    files.push_back({f.name, f.size, 0, ""});
  }
  ManifestInfo info;
  info.step = step;
  info.world_size = S;
  info.shard_size = S;
  store.commit(step, build_manifest(info, cfg, layout, files));
}

std::string temp_root(const std::string& name) {
  return testing::TempDir() + "mx_sharded_" + std::to_string(::getpid()) + "_" + name;
}

}  // namespace

TEST(ShardedCheckpoint, ReshardsToAnyRankCount) {
  ModelConfig cfg = odd_model();
  ParamLayout layout(cfg);
  const int64_t n = layout.total_numel();
  std::vector<float> w = random_vector(n, 1), m = random_vector(n, 2), v = random_vector(n, 3);
  for (float& x : v) x = std::fabs(x);  // second moments: loading refuses negative ones
  const std::vector<float>* full[3] = {&w, &m, &v};
  for (int S : {1, 3, 4}) {
    const std::string root = temp_root("reshard" + std::to_string(S));
    fs::remove_all(root);
    auto store = open_checkpoint_store(root);
    write_step(*store, 7, cfg, layout, S, full);
    ASSERT_EQ(store->committed_steps(), std::vector<int64_t>{7});
    for (int M : {1, 2, 3, 5}) {
      for (int r = 0; r < M; ++r) {
        CheckpointReader reader(*store, 7);
        EXPECT_EQ(reader.shard_size(), S);
        ShardView view = shard_view(layout, M, r);
        std::vector<float> got[3];
        for (auto& g : got) g.assign(size_t(view.local_numel()), 123.0f);
        load_shards(reader, view, got[0].data(), got[1].data(), got[2].data());
        for (int k = 0; k < 3; ++k)
          for (size_t u = 0; u < view.units.size(); ++u) {
            const auto& sl = view.units[u];
            for (int64_t i = 0; i < sl.shard_numel; ++i) {
              float want = i < sl.valid_numel(r)
                               ? (*full[k])[size_t(layout.units()[u].offset + sl.shard_begin(r) + i)]
                               : 0.0f;  // padding reads as zero
              ASSERT_EQ(got[k][size_t(view.local_offset[u] + i)], want)
                  << "S=" << S << " M=" << M << " r=" << r << " kind " << k << " unit " << u
                  << " i " << i;
            }
          }
        auto extra = reader.read_extra(r % S, "recipe.test");
        ASSERT_TRUE(extra.has_value());
        EXPECT_EQ((*extra)[0], float(r % S));
      }
    }
    // The whole model, as export-hf reads it.
    CheckpointReader reader(*store, 7);
    std::vector<float> all(size_t(n), 9.0f);
    load_shards(reader, whole_model_view(layout), all.data(), nullptr, nullptr);
    EXPECT_EQ(all, w);
    fs::remove_all(root);
  }
}

TEST(ShardedCheckpoint, ADifferentModelIsRefused) {
  ModelConfig cfg = odd_model();
  ParamLayout layout(cfg);
  std::vector<float> w = random_vector(layout.total_numel(), 4);
  const std::vector<float>* full[3] = {&w, &w, &w};
  const std::string root = temp_root("other");
  fs::remove_all(root);
  auto store = open_checkpoint_store(root);
  write_step(*store, 3, cfg, layout, 2, full);
  ModelConfig other = cfg;
  other.intermediate_size = 38;
  other.finalize();
  ParamLayout other_layout(other);
  CheckpointReader reader(*store, 3);
  std::vector<float> buf(size_t(other_layout.total_numel()));
  EXPECT_THROW(load_shards(reader, whole_model_view(other_layout), buf.data(), nullptr, nullptr),
               UserError);
  fs::remove_all(root);
}

TEST(ShardedCheckpoint, UncommittedAndRemovedStepsAreInvisible) {
  ModelConfig cfg = odd_model();
  ParamLayout layout(cfg);
  std::vector<float> w = random_vector(layout.total_numel(), 5);
  const std::vector<float>* full[3] = {&w, &w, &w};
  const std::string root = temp_root("commit");
  fs::remove_all(root);
  auto store = open_checkpoint_store(root);
  write_step(*store, 1, cfg, layout, 1, full);
  write_step(*store, 2, cfg, layout, 1, full);
  // A step whose files are written but whose manifest is not: not there.
  std::string x = "partial";
  store->write_file(3, rank_file_name(0, 1), x.data(), x.size());
  EXPECT_EQ(store->committed_steps(), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(fs::exists(root + "/.step_00000003.partial"));
  store->remove_uncommitted();
  EXPECT_FALSE(fs::exists(root + "/.step_00000003.partial"));
  prune_checkpoints(*store, 1, 2);
  EXPECT_EQ(store->committed_steps(), (std::vector<int64_t>{2}));
  EXPECT_FALSE(fs::exists(root + "/step_00000001"));
  // A committed step above the one just committed (junk, or a corrupt step resume skipped) is
  // neither deleted nor counted: step 2 stays although keep = 1 and step 5 is newer.
  write_step(*store, 5, cfg, layout, 1, full);
  prune_checkpoints(*store, 1, 2);
  EXPECT_EQ(store->committed_steps(), (std::vector<int64_t>{2, 5}));
  fs::remove_all(root);
}

TEST(ShardedCheckpoint, LocationsParseAsUsersWriteThem) {
  auto a = parse_checkpoint_location("runs/x/checkpoints/step_00000040");
  EXPECT_EQ(a.root, "runs/x/checkpoints");
  EXPECT_EQ(a.step, 40);
  auto b = parse_checkpoint_location("runs/x/checkpoints/");
  EXPECT_EQ(b.root, "runs/x/checkpoints");
  EXPECT_EQ(b.step, -1);
  auto c = parse_checkpoint_location("s3://bkt/run/step_00000100/");
  EXPECT_EQ(c.root, "s3://bkt/run");
  EXPECT_EQ(c.step, 100);
  auto d = parse_checkpoint_location("s3://bkt/run");
  EXPECT_EQ(d.root, "s3://bkt/run");
  EXPECT_EQ(d.step, -1);
  auto e = parse_checkpoint_location("step_00000005");
  EXPECT_EQ(e.root, ".");
  EXPECT_EQ(e.step, 5);
  EXPECT_EQ(parse_step_dir_name("step_0000001"), -1);  // 7 digits: not ours
  EXPECT_EQ(rank_file_name(3, 16), "rank_00003-of-00016.safetensors");
}
