// What the prefill kernels (prefill_attention.cpp in bf16, prefill_attention_fp32.cpp) share: their
// arguments, checked once here and made contiguous, and the walk over the key tiles they pack.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "int8_pool.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

struct PrefillInputs {
  torch::Tensor q, k_cache, v_cache, k_scales, v_scales, block_tables, starts, context_lens;
  bool int8;
};

// q [T, Hq, 64|128] in `dtype`; the caches [num_blocks, block_size, Hkv, D] in `dtype`, or int8
// with both scales; block_tables [S, W], starts [S + 1] (ending at T), context_lens [S], int32
inline PrefillInputs prefill_inputs(const torch::Tensor& q, const torch::Tensor& k_cache,
                                    const torch::Tensor& v_cache,
                                    const torch::Tensor& block_tables, const torch::Tensor& starts,
                                    const torch::Tensor& context_lens,
                                    const c10::optional<torch::Tensor>& k_scales,
                                    const c10::optional<torch::Tensor>& v_scales,
                                    torch::ScalarType dtype) {
  TORCH_CHECK(q.dim() == 3 && (q.size(2) == 64 || q.size(2) == 128), "q must be [T, Hq, 64|128]");
  const bool int8 = k_cache.scalar_type() == torch::kInt8;
  const auto pool = int8 ? torch::kInt8 : dtype;
  TORCH_CHECK(q.scalar_type() == dtype && k_cache.scalar_type() == pool &&
                  v_cache.scalar_type() == pool,
              "paged_prefill takes q and caches of one dtype (or int8 caches)");
  PrefillInputs in{q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), {}, {},
                   block_tables.contiguous(), starts.contiguous(), context_lens.contiguous(),
                   int8};
  if (int8) std::tie(in.k_scales, in.v_scales) = int8_pool_scales(k_cache, v_cache, k_scales, v_scales);
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(2) == 0,
              "the caches must be [num_blocks, block_size, Hkv, head_dim], Hq a multiple of Hkv");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 &&
                  starts.scalar_type() == torch::kInt32 &&
                  context_lens.scalar_type() == torch::kInt32 &&
                  starts.size(0) == block_tables.size(0) + 1 &&
                  context_lens.size(0) == block_tables.size(0),
              "block tables [S, W], starts [S + 1] and context lengths [S] must be int32");
  TORCH_CHECK(in.starts[-1].item<int32_t>() == q.size(0), "starts must end at q's length");
  return in;
}

// The first key tile of each sequence, in tiles of `keys` keys (per KV head); the last entry is
// the step's total. Packed tiles are head-interleaved: sequence s's tile j of KV head h is
// (bases[s] + j) * kv_heads + h.
inline std::vector<int64_t> tile_bases(const int32_t* context_lens, int64_t seqs, int64_t keys) {
  std::vector<int64_t> bases(seqs + 1, 0);
  for (int64_t s = 0; s < seqs; ++s) bases[s + 1] = bases[s] + (context_lens[s] + keys - 1) / keys;
  return bases;
}

// fn(i, s, h, first_key) for every packed tile i (of sequence s, KV head h, from key first_key),
// in parallel
template <typename Fn>
void each_tile(const std::vector<int64_t>& bases, int64_t kv_heads, int64_t keys, const Fn& fn) {
  at::parallel_for(0, bases.back() * kv_heads, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / kv_heads, h = i % kv_heads;
      const int64_t s = std::upper_bound(bases.begin(), bases.end(), t) - bases.begin() - 1;
      fn(i, s, h, (t - bases[s]) * keys);
    }
  });
}

// One query row's scores over a tile of N keys made probabilities against its running max `top`,
// the first `visible` keys being those its position sees; `total` (its sum of exps) and `top`
// updated. Returns alpha, the factor its earlier sums shrink by. In vectors, the exps through
// glibc's libmvec (one at a time they took longer than the tile's dot products), their arguments
// kept within [-80, 0]: one lane outside sends the vector exp down its slow path, which masked
// keys did at every diagonal tile (a 420-token prompt's attention took 1.26x the time).
template <int64_t N>
inline float tile_probabilities(float* s, int64_t visible, float& top, float& total) {
  float best = top, sum = 0.f;
  for (int64_t n = 0; n < visible; ++n) best = std::max(best, s[n]);
#pragma omp simd
  for (int64_t n = 0; n < N; ++n) s[n] = std::exp(std::max(s[n] - best, -80.f));
  for (int64_t n = visible; n < N; ++n) s[n] = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t n = 0; n < N; ++n) sum += s[n];
  const float alpha = std::exp(top - best);
  total = total * alpha + sum;
  top = best;
  return alpha;
}
