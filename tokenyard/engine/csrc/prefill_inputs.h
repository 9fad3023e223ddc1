// What the prefill kernels (prefill_attention.cpp in bf16, prefill_attention_fp32.cpp) share: their
// arguments, checked once here and made contiguous, the walk over the key tiles they pack, and how
// their exact modes cut a step into work (`exact_attention`).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "attention_parts.h"
#include "int8_pool.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
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

// Every sequence's new rows through an exact mode, the step cut as both kernels cut it: runs of
// the query heads of one KV head at consecutive positions, at most EXACT_LANES rows, padded to
// whole vectors; each run cut into the decode kernel's parts by position, one work item each (the
// most work first, so that the threads finish together); then each row's parts merged into `out`
// (float or bf16; the pool's T is float, or uint16_t for bf16's bits). `fill(at, dst, stride)`
// writes the row whose q starts at element `at` transposed, each of its `width` values (fp32
// dimensions, bf16 pairs) `stride` apart; `attend(nv, qt, limit, rows, pool, lo, hi, o, top,
// total)` runs one part [lo, hi) of a run whose rows fill nv vectors (an integral_constant), as
// its kernel's exact mode does.
template <int64_t D, typename Q, typename T, typename Out, typename Fill, typename Attend>
void exact_attention(const PrefillInputs& in, Out* out, int64_t width, const Fill& fill,
                     const Attend& attend) {
  const auto* k_cache = reinterpret_cast<const T*>(in.k_cache.data_ptr());
  const auto* v_cache = reinterpret_cast<const T*>(in.v_cache.data_ptr());
  const int32_t* tables = in.block_tables.data_ptr<int32_t>();
  const int32_t* starts = in.starts.data_ptr<int32_t>();
  const int32_t* context_lens = in.context_lens.data_ptr<int32_t>();
  const int64_t seqs = in.block_tables.size(0), q_heads = in.q.size(1);
  const int64_t kv_heads = in.k_cache.size(2), block_size = in.k_cache.size(1);
  const int64_t max_blocks = in.block_tables.size(1);
  struct Run {
    int64_t seq, head, first, count, padded, parts, slot, qt;
  };
  struct Item {
    int64_t run, part, lo, hi;
  };
  const int64_t group = q_heads / kv_heads, positions = std::max<int64_t>(1, EXACT_LANES / group);
  std::vector<Run> runs;
  std::vector<Item> items;
  int64_t slots = 0, qt_size = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t num_new = starts[s + 1] - starts[s], cached = context_lens[s] - num_new;
    for (int64_t first = 0; first < num_new; first += positions)
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t count = std::min(positions, num_new - first);
        const int64_t padded = (count * group + L - 1) / L * L;
        const int64_t keys = cached + first + count, parts = (keys + PART - 1) / PART;
        for (int64_t p = 0; p < parts; ++p)
          items.push_back({static_cast<int64_t>(runs.size()), p, p * PART,
                           std::min(keys, (p + 1) * PART)});
        runs.push_back({s, h, first, count, padded, parts, slots, qt_size});
        slots += parts * padded;
        qt_size += width * padded;
      }
  }
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  // where a run's row (position first + row / group, query head row % group of its KV head's)
  // lies in q, and in the output, in elements
  auto row_at = [&](const Run& run, int64_t row) {
    const int64_t i = run.first + row / group, g = row % group;
    return ((starts[run.seq] + i) * q_heads + run.head * group + g) * D;
  };
  std::vector<Q> qts(qt_size, Q{});  // padding rows zero
  at::parallel_for(0, num_runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t row = 0; row < runs[r].count * group; ++row)
        fill(row_at(runs[r], row), &qts[runs[r].qt + row], runs[r].padded);
  });
  auto work = [&](const Item& it) { return (it.hi - it.lo) * runs[it.run].padded; };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& a, const Item& b) { return work(a) > work(b); });
  std::vector<float> o_all(slots * D), top_all(slots), total_all(slots);
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
  for (int64_t w = 0; w < num_items; ++w) {
    const Item& it = items[w];
    const Run& run = runs[it.run];
    const int64_t rows = run.count * group;
    const int64_t cached = context_lens[run.seq] - (starts[run.seq + 1] - starts[run.seq]);
    int64_t limit[EXACT_LANES];  // the last key each row sees
    for (int64_t r = 0; r < rows; ++r) limit[r] = cached + run.first + r / group;
    const HeadPool<T> pool{k_cache, v_cache, tables + run.seq * max_blocks, block_size, kv_heads,
                           run.head};
    const int64_t slot = run.slot + it.part * run.padded;
    auto part = [&](auto nv) {
      attend(nv, &qts[run.qt], limit, rows, pool, it.lo, it.hi, &o_all[slot * D], &top_all[slot],
             &total_all[slot]);
    };
    if (run.padded == L)
      part(std::integral_constant<int, 1>{});
    else if (run.padded == 2 * L)
      part(std::integral_constant<int, 2>{});
    else
      part(std::integral_constant<int, 3>{});
  }
  at::parallel_for(0, num_runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t row = 0; row < runs[r].count * group; ++row) {
        const int64_t first = runs[r].slot + row;
        merge_parts(&top_all[first], &total_all[first], &o_all[first * D], runs[r].parts,
                    runs[r].padded, D, out + row_at(runs[r], row));
      }
  });
}
