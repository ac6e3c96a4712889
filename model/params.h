// Parameter layout: every parameter lives in one flat fp32 buffer, grouped into units
// (embedding, one per transformer block, head). A unit is what FSDP shards and gathers, so a
// unit's tensors are contiguous. Gradients and optimizer state use the same layout.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace mx {

struct ParamTensor {
  std::string hf_name;  // Hugging Face name, e.g. model.layers.0.mlp.up_proj.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in floats, from the start of the flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies to matrices, not to RMSNorm weights
};

struct ParamUnit {
  std::string name;  // "embed", "block.3", "head"
  int64_t offset = 0;
  int64_t numel = 0;
  std::vector<int> tensors;  // indices into ParamLayout::tensors
};

// Pointers to one block's weights (or gradients) inside a flat buffer.
struct BlockParams {
  float* input_norm;  // [C]
  float* wq;          // [H*D, C]
  float* wk;          // [KV*D, C]
  float* wv;          // [KV*D, C]
  float* wo;          // [C, H*D]
  float* post_norm;   // [C]
  float* w_gate;      // [I, C]
  float* w_up;        // [I, C]
  float* w_down;      // [C, I]
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  int64_t total_numel() const { return total_; }
  const ParamTensor* find(const std::string& hf_name) const;  // nullptr if absent

  BlockParams block(float* base, int64_t layer) const;
  float* embedding(float* base) const { return base + embed_offset_; }
  float* final_norm(float* base) const { return base + final_norm_offset_; }
  // The output head's matrix: lm_head, or the embedding when tied.
  float* head(float* base) const { return base + head_offset_; }

  // Unit-relative access, for code that holds one unit at a time (FSDP gathers a unit into its
  // own buffer): units are 0 = embedding, 1 + l = block l, num_layers + 1 = head.
  int embed_unit() const { return 0; }
  int block_unit(int64_t layer) const { return int(1 + layer); }
  int head_unit() const { return int(units_.size()) - 1; }
  BlockParams block_in_unit(float* unit_base, int64_t layer) const;
  // The offsets of block `layer`'s nine tensors from its unit's start, in BlockParams order
  // (for a unit held in another form than fp32: FSDP's bf16 gathers).
  std::array<int64_t, 9> block_offsets_in_unit(int64_t layer) const;
  float* final_norm_in_unit(float* head_unit_base) const {
    return head_unit_base + (final_norm_offset_ - units_.back().offset);
  }
  // lm_head inside the head unit; only for untied models (tied heads live in the embed unit).
  float* lm_head_in_unit(float* head_unit_base) const {
    return head_unit_base + (head_offset_ - units_.back().offset);
  }
  bool tied() const { return head_offset_ == embed_offset_; }

 private:
  int add(const std::string& name, std::vector<int64_t> shape, bool decay);
  std::vector<ParamTensor> tensors_;
  std::vector<ParamUnit> units_;
  std::vector<int64_t> block_offsets_;  // per layer: offsets of its 9 tensors, in BlockParams order
  int64_t total_ = 0, embed_offset_ = 0, final_norm_offset_ = 0, head_offset_ = 0;
};

// Random initialization (HF initializer_range 0.02 for matrices, ones for RMSNorm weights),
// reproducible from the seed and independent of thread count: tensor i draws from a
// generator seeded with (seed, i).
void init_params(const ParamLayout& layout, float* params, uint64_t seed, float stddev = 0.02f);

}  // namespace mx
