#include "model/params.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace mx {

int ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool decay) {
  ParamTensor t;
  t.hf_name = name;
  t.numel = 1;
  for (auto d : shape) t.numel *= d;
  t.shape = std::move(shape);
  t.offset = total_;
  t.decay = decay;
  total_ += t.numel;
  tensors_.push_back(std::move(t));
  units_.back().tensors.push_back(int(tensors_.size() - 1));
  units_.back().numel += tensors_.back().numel;
  return int(tensors_.size() - 1);
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  auto begin_unit = [&](const std::string& name) {
    ParamUnit u;
    u.name = name;
    u.offset = total_;
    units_.push_back(u);
  };
  begin_unit("embed");
  embed_offset_ = tensors_[add("model.embed_tokens.weight", {V, C}, true)].offset;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    begin_unit(str("block.", l));
    std::string p = str("model.layers.", l, ".");
    block_offsets_.push_back(tensors_[add(p + "input_layernorm.weight", {C}, false)].offset);
    block_offsets_.push_back(tensors_[add(p + "self_attn.q_proj.weight", {c.q_dim(), C}, true)].offset);
    block_offsets_.push_back(tensors_[add(p + "self_attn.k_proj.weight", {c.kv_dim(), C}, true)].offset);
    block_offsets_.push_back(tensors_[add(p + "self_attn.v_proj.weight", {c.kv_dim(), C}, true)].offset);
    block_offsets_.push_back(tensors_[add(p + "self_attn.o_proj.weight", {C, c.q_dim()}, true)].offset);
    block_offsets_.push_back(tensors_[add(p + "post_attention_layernorm.weight", {C}, false)].offset);
    block_offsets_.push_back(tensors_[add(p + "mlp.gate_proj.weight", {I, C}, true)].offset);
    block_offsets_.push_back(tensors_[add(p + "mlp.up_proj.weight", {I, C}, true)].offset);
    block_offsets_.push_back(tensors_[add(p + "mlp.down_proj.weight", {C, I}, true)].offset);
  }
  begin_unit("head");
  final_norm_offset_ = tensors_[add("model.norm.weight", {C}, false)].offset;
  head_offset_ = c.tie_word_embeddings ? embed_offset_
                                       : tensors_[add("lm_head.weight", {V, C}, true)].offset;
}

const ParamTensor* ParamLayout::find(const std::string& hf_name) const {
  for (auto& t : tensors_)
    if (t.hf_name == hf_name) return &t;
  return nullptr;
}

BlockParams ParamLayout::block(float* base, int64_t layer) const {
  const int64_t* o = block_offsets_.data() + layer * 9;
  return BlockParams{base + o[0], base + o[1], base + o[2], base + o[3], base + o[4],
                     base + o[5], base + o[6], base + o[7], base + o[8]};
}

std::array<int64_t, 9> ParamLayout::block_offsets_in_unit(int64_t layer) const {
  const int64_t* o = block_offsets_.data() + layer * 9;
  const int64_t u = units_[block_unit(layer)].offset;
  std::array<int64_t, 9> r;
  for (int i = 0; i < 9; ++i) r[size_t(i)] = o[i] - u;
  return r;
}

BlockParams ParamLayout::block_in_unit(float* unit_base, int64_t layer) const {
  const std::array<int64_t, 9> o = block_offsets_in_unit(layer);
  auto at = [&](int i) { return unit_base + o[size_t(i)]; };
  return BlockParams{at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8)};
}

void init_params(const ParamLayout& layout, float* params, uint64_t seed, float stddev) {
  const auto& ts = layout.tensors();
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < ts.size(); ++i) {
    const ParamTensor& t = ts[i];
    float* p = params + t.offset;
    if (t.shape.size() == 1) {
      for (int64_t j = 0; j < t.numel; ++j) p[j] = 1.0f;
      continue;
    }
    std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ull + i + 1);
    std::normal_distribution<float> normal(0.0f, stddev);
    for (int64_t j = 0; j < t.numel; ++j) p[j] = normal(gen);
  }
}

}  // namespace mx
