// Prefill attention over the paged KV pool in fp32, for CPUs without bf16 dot products (AVX2 only,
// or AVX-512 without AVX512-BF16), where the engine's activations are fp32: causal attention of
// each sequence's new chunk against its whole context, in the tiled online-softmax form of flash
// attention, as the bf16 kernel (prefill_attention.cpp) does, but with FMAs on vectors of the
// machine's width (vectors.h). PyTorch's CPU flash kernel, which the engine called once a
// sequence before, runs fp32 at about 35 GFLOP/s on a 2-core Zen 3 EPYC (bench/RESULTS.md).
//
// Two passes, both parallel: (1) every key tile of every (sequence, KV head) is read once through
// the block table, keys transposed (one vector holds a dimension of KT keys, so a query's scores
// against the tile are FMAs of broadcast query values) and values as rows, an int8 pool's rows
// dequantized (each times its scale); (2) each work item -- a sequence, a KV head and a run of
// query positions, for all the query heads that share the KV head -- walks the key tiles it sees,
// then writes its rows normalized. Exact mode (speculation's verify rows, which must repeat a lone
// decode's sums bit for bit) works otherwise: `exact_part` below.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "attention_parts.h"
#include "prefill_inputs.h"
#include "vectors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t KT = 2 * L;     // keys per tile: two vectors of scores a row
constexpr int64_t RB = 4;         // query rows per register block: 8 score vectors, 2 of keys
constexpr int64_t M = 32;         // query positions per work item
constexpr int64_t PV_VECS = 8;    // P.V accumulators held at once (of a row's D / L)
constexpr float MASKED = -1e30f;  // finite: built with -ffast-math, which assumes no infinities

alignas(64) constexpr float ZERO_ROW[128] = {};  // the query rows that pad a run to RB

// keys [first, first + KT) of a (sequence, KV head), read through its block table into kt[d][n]
// (transposed) and vt[n][d]; an int8 row times its scale; keys past the context are zeros
template <int64_t D, typename T>
void pack_tile(const T* k_cache, const T* v_cache, const float* k_scales, const float* v_scales,
               const int32_t* table, int64_t block_size, int64_t kv_heads, int64_t head,
               int64_t first, int64_t keys, float* kt, float* vt) {
  int64_t block = first / block_size, offset = first % block_size;
  for (int64_t n = 0; n < KT; ++n) {
    vec k[D / L] = {}, v[D / L] = {};
    if (first + n < keys) {
      const int64_t at = (table[block] * block_size + offset) * kv_heads + head;
      load_row<D>(k_cache + at * D, k);
      load_row<D>(v_cache + at * D, v);
      if (k_scales != nullptr)
        for (int64_t c = 0; c < D / L; ++c) k[c] *= k_scales[at], v[c] *= v_scales[at];
    }
    for (int64_t d = 0; d < D; ++d) kt[d * KT + n] = k[d / L][d % L];
    std::memcpy(vt + n * D, v, sizeof v);
    if (++offset == block_size) offset = 0, ++block;
  }
}

// s[r][n] = scale * q_r . k_n for RB rows against one tile
template <int64_t D>
inline void scores(const float* const* q, const float* kt, float scale, float* s) {
  vec acc[RB][2] = {};
  for (int64_t d = 0; d < D; ++d) {
    const vec k0 = load_vec(kt + d * KT), k1 = load_vec(kt + d * KT + L);
    for (int64_t r = 0; r < RB; ++r) {
      const float x = q[r][d];
      acc[r][0] += x * k0;
      acc[r][1] += x * k1;
    }
  }
  for (int64_t r = 0; r < RB; ++r) {
    store_vec(s + r * KT, acc[r][0] * scale);
    store_vec(s + r * KT + L, acc[r][1] * scale);
  }
}

// o[r] = o[r] * alpha[r] + sum_n p[r][n] v_n for RB rows, PV_VECS vectors of a row at a time
template <int64_t D>
inline void accumulate(const float* p, const float* vt, const float* alpha, float* o) {
  constexpr int64_t C = D / L, STEP = C < PV_VECS ? C : PV_VECS;
  for (int64_t r = 0; r < RB; ++r)
    for (int64_t c0 = 0; c0 < C; c0 += STEP) {
      vec acc[STEP];
      for (int64_t c = 0; c < STEP; ++c) acc[c] = load_vec(o + r * D + (c0 + c) * L) * alpha[r];
      for (int64_t n = 0; n < KT; ++n) {
        const float w = p[r * KT + n];
        for (int64_t c = 0; c < STEP; ++c) acc[c] += w * load_vec(vt + n * D + (c0 + c) * L);
      }
      for (int64_t c = 0; c < STEP; ++c) store_vec(o + r * D + (c0 + c) * L, acc[c]);
    }
}

struct Run {
  int64_t seq, head, first, count;  // query positions [first, first + count) of a sequence
};

template <int64_t D, typename T>
void prefill(const float* q, const T* k_cache, const T* v_cache, const float* k_scales,
             const float* v_scales, const int32_t* tables, const int32_t* starts,
             const int32_t* context_lens, float* out, int64_t seqs, int64_t q_heads,
             int64_t kv_heads, int64_t block_size, int64_t max_blocks, float scale) {
  const int64_t group = q_heads / kv_heads, tile_floats = KT * D;
  // pass 1: pack every key tile of every (sequence, KV head), head-interleaved
  const std::vector<int64_t> tile_base = tile_bases(context_lens, seqs, KT);
  const int64_t tiles = tile_base[seqs];
  // written whole below: left uninitialized
  std::unique_ptr<float[]> packed_k(new float[tiles * kv_heads * tile_floats]),
      packed_v(new float[tiles * kv_heads * tile_floats]);
  each_tile(tile_base, kv_heads, KT, [&](int64_t i, int64_t s, int64_t h, int64_t first_key) {
    pack_tile<D>(k_cache, v_cache, k_scales, v_scales, tables + s * max_blocks, block_size,
                 kv_heads, h, first_key, context_lens[s], packed_k.get() + i * tile_floats,
                 packed_v.get() + i * tile_floats);
  });
  // pass 2: runs of query positions, the most work first so that the threads finish together
  std::vector<Run> runs;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t num_new = starts[s + 1] - starts[s];
    for (int64_t first = 0; first < num_new; first += M)
      for (int64_t h = 0; h < kv_heads; ++h) runs.push_back({s, h, first, std::min(M, num_new - first)});
  }
  auto cached = [&](int64_t seq) { return context_lens[seq] - (starts[seq + 1] - starts[seq]); };
  auto seen = [&](const Run& run) {  // the keys a run sees: its context up to its last position
    return cached(run.seq) + run.first + run.count;
  };
  std::stable_sort(runs.begin(), runs.end(),
                   [&](const Run& a, const Run& b) { return seen(a) * a.count > seen(b) * b.count; });
  const int64_t num_runs = static_cast<int64_t>(runs.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
  for (int64_t w = 0; w < num_runs; ++w) {
    const Run& run = runs[w];
    const int64_t rows = run.count * group, padded = (rows + RB - 1) / RB * RB;
    std::vector<const float*> qr(padded, ZERO_ROW);
    std::vector<int64_t> limit(padded, -1);  // the last key each row sees (padding: none)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = run.first + r / group, g = r % group;
      qr[r] = q + ((starts[run.seq] + i) * q_heads + run.head * group + g) * D;
      limit[r] = cached(run.seq) + i;
    }
    std::vector<float> o(padded * D, 0.f), top(padded, MASKED), total(padded, 0.f);
    float s[RB * KT], alpha[RB];
    const int64_t tile0 = tile_base[run.seq] * kv_heads + run.head;
    for (int64_t kt = 0; kt < (seen(run) + KT - 1) / KT; ++kt) {
      const float* kp = packed_k.get() + (tile0 + kt * kv_heads) * tile_floats;
      const float* vp = packed_v.get() + (tile0 + kt * kv_heads) * tile_floats;
      const int64_t k0 = kt * KT;
      for (int64_t r0 = 0; r0 < padded; r0 += RB) {
        if (limit[std::min(r0 + RB, rows) - 1] < k0) continue;  // the whole tile is in the future
        scores<D>(&qr[r0], kp, scale, s);
        for (int64_t r = 0; r < RB; ++r) {
          float* sr = s + r * KT;
          const int64_t visible = std::clamp<int64_t>(limit[r0 + r] - k0 + 1, 0, KT);
          if (visible == 0) {  // nothing of this tile yet: the row's sums stay as they are
            std::fill(sr, sr + KT, 0.f);
            alpha[r] = 1.f;
            continue;
          }
          alpha[r] = tile_probabilities<KT>(sr, visible, top[r0 + r], total[r0 + r]);
        }
        accumulate<D>(s, vp, alpha, o.data() + r0 * D);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = run.first + r / group, g = r % group;
      float* dst = out + ((starts[run.seq] + i) * q_heads + run.head * group + g) * D;
      const float inv = 1.f / total[r];
      for (int64_t c = 0; c < D / L; ++c) store_vec(dst + c * L, load_vec(o.data() + r * D + c * L) * inv);
    }
  }
}

// ------------------------------------------------------------------ exact mode
// A speculating sequence's rows (its last token and draft) attend as lone decodes do, to the bit:
// attention_parts.h's fp32 arithmetic, which the decode kernel runs on an fp32 pool. Through the
// packed form above they would be summed in another order, and as decode rows each reads its
// whole context again (9 rows over 600 tokens: about twice the time of this, AVX-512 or AVX2,
// bench/RESULTS.md). Here a run's rows (positions x the query heads of one KV head, in at most
// EXACT_VECTORS vectors) sit in vector lanes: each key row, read in place through the block
// table, is broadcast a dimension at a time against the transposed, scaled queries, the L partial
// sums a decode row's lanes would hold kept apart and added in the decode kernel's tree, so that
// the scores, the softmax's max, exps and sums run down the lanes. An fp32 pool only: an int8
// pool's draft rows run as decode rows (engine/attention.py).

// One key's scores against NV vectors of rows (qt[(d * NV + v) * L + lane]: row v L + lane's
// dimension d, scaled): for each lane l of a decode row, the products of dimensions l, l + L, …,
// then tree_of's sum, each four lanes of it added as soon as they are made (few registers live).
template <int64_t D, int NV>
inline void exact_scores(const float* qt, const float* k, vec (&s)[NV]) {
  constexpr int64_t C = D / L;
  auto lane = [&](int64_t l, vec (&x)[NV]) {
    for (int v = 0; v < NV; ++v) x[v] = load_vec(qt + (l * NV + v) * L) * k[l];
    for (int64_t c = 1; c < C; ++c) {
      const vec kc = vec{} + k[c * L + l];
      for (int v = 0; v < NV; ++v)
        x[v] = fmadd(load_vec(qt + ((c * L + l) * NV + v) * L), kc, x[v]);
    }
  };
  vec g[L / 4][NV];  // tree_of's sums of lanes k, k + L / 2, k + L / 4 and k + 3L / 4
  for (int64_t k4 = 0; k4 < L / 4; ++k4) {
    vec a[NV], b[NV], c[NV], d[NV];
    lane(k4, a);
    lane(k4 + L / 2, b);
    lane(k4 + L / 4, c);
    lane(k4 + 3 * L / 4, d);
    for (int v = 0; v < NV; ++v)
      g[k4][v] = add_in_order(add_in_order(a[v], b[v]), add_in_order(c[v], d[v]));
  }
  for (int64_t h = L / 8; h >= 1; h /= 2)
    for (int64_t k = 0; k < h; ++k)
      for (int v = 0; v < NV; ++v) g[k][v] = add_in_order(g[k][v], g[k + h][v]);
  for (int v = 0; v < NV; ++v) s[v] = g[0][v];
}

// A run's rows (qt as exact_scores reads it; limit: the last key each sees) against the part of
// keys [lo, hi) (lo a multiple of PART, hi - lo at most PART): each row's max `top`, sum of exps
// `total` and unnormalized sums `o` [NV L, D] over the keys it sees, as the decode kernel's part
// has them
template <int64_t D, int NV>
void exact_part(const float* qt, const int64_t* limit, int64_t rows, const HeadPool<float>& pool,
                int64_t lo, int64_t hi, float* o, float* top, float* total) {
  constexpr int64_t W = NV * L, C = D / L;
  constexpr int64_t RBX = std::max<int64_t>(1, L / C);  // P.V rows at once: L accumulators
  const int64_t n = hi - lo;
  int64_t at[PART];  // the part's rows
  pool.template rows_of<D>(lo, n, at);
  alignas(64) float p[PART][W];
  index_vec last[NV];  // padding lanes see no key
  vec best[NV];
  for (int v = 0; v < NV; ++v) {
    for (int64_t i = 0; i < L; ++i)
      last[v][i] = v * L + i < rows ? static_cast<int32_t>(limit[v * L + i]) : -1;
    best[v] = vec{} + MASKED;
  }
  auto seen = [&](int64_t t, int v) {  // the lanes whose row sees key lo + t
    return (index_vec{} + static_cast<int32_t>(lo + t)) <= last[v];
  };
  // scores, and the max of the ones each row sees
  for (int64_t t = 0; t < n; ++t) {
    if (t + PREFETCH_TOKENS < n) pool.template prefetch<D>(at[t + PREFETCH_TOKENS]);
    vec s[NV];
    exact_scores<D, NV>(qt, pool.k + at[t] * D, s);
    for (int v = 0; v < NV; ++v) {
      best[v] = seen(t, v) && s[v] > best[v] ? s[v] : best[v];
      store_vec(p[t] + v * L, s[v]);
    }
  }
  // probabilities (a key a row does not see weighs 0), summed by position modulo L
  vec by_lane[L][NV] = {};
  for (int64_t t = 0; t < n; ++t)
    for (int v = 0; v < NV; ++v) {
      const vec e = seen(t, v) ? part_exps(load_vec(p[t] + v * L), best[v]) : vec{};
      store_vec(p[t] + v * L, e);
      by_lane[t % L][v] = add_in_order(by_lane[t % L][v], e);
    }
  for (int v = 0; v < NV; ++v) {
    vec lanes[L];
    for (int64_t l = 0; l < L; ++l) lanes[l] = by_lane[l][v];
    store_vec(total + v * L, tree_of(lanes));
    store_vec(top + v * L, best[v]);
  }
  // P.V: RBX rows at a time against each key's values, from zero
  for (int64_t r0 = 0; r0 < rows; r0 += RBX) {
    vec acc[RBX][C] = {};
    for (int64_t t = 0; t < n; ++t) {
      vec values[C];
      load_row<D>(pool.v + at[t] * D, values);
      for (int64_t r = 0; r < RBX; ++r) {
        const vec pr = vec{} + p[t][r0 + r];
        for (int64_t c = 0; c < C; ++c) acc[r][c] = fmadd(pr, values[c], acc[r][c]);
      }
    }
    for (int64_t r = 0; r < RBX; ++r)
      for (int64_t c = 0; c < C; ++c) store_vec(o + (r0 + r) * D + c * L, acc[r][c]);
  }
}

}  // namespace

// As paged_prefill (prefill_attention.cpp) with q and out float32 and a float32 pool (or int8 with
// k_scales and v_scales); `exact`: each row as a lone decode computes it (an fp32 pool only)
torch::Tensor paged_prefill_fp32(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                 torch::Tensor block_tables, torch::Tensor starts,
                                 torch::Tensor context_lens, double scale, bool exact,
                                 c10::optional<torch::Tensor> k_scales,
                                 c10::optional<torch::Tensor> v_scales) {
  const PrefillInputs in = prefill_inputs(q, k_cache, v_cache, block_tables, starts, context_lens,
                                          k_scales, v_scales, torch::kFloat32);
  TORCH_CHECK(!exact || in.q.size(1) / in.k_cache.size(2) <= EXACT_LANES,
              "exact mode takes at most ", EXACT_LANES, " query heads per KV head");
  TORCH_CHECK(!exact || !in.int8,
              "exact mode reads an fp32 pool (an int8 one's drafts: decode rows)");
  auto out = torch::empty_like(in.q);
  auto run = [&](auto cache_type, auto fn) {
    using T = decltype(cache_type);
    fn(in.q.data_ptr<float>(), in.k_cache.data_ptr<T>(), in.v_cache.data_ptr<T>(),
       in.int8 ? in.k_scales.data_ptr<float>() : nullptr,
       in.int8 ? in.v_scales.data_ptr<float>() : nullptr, in.block_tables.data_ptr<int32_t>(),
       in.starts.data_ptr<int32_t>(), in.context_lens.data_ptr<int32_t>(),
       out.data_ptr<float>(), in.block_tables.size(0), in.q.size(1), in.k_cache.size(2),
       in.k_cache.size(1), in.block_tables.size(1), static_cast<float>(scale));
  };
  if (exact) {
    auto rows = [&](auto d) {  // scaled as the decode kernel scales q, then exact_part
      constexpr int64_t D = decltype(d)::value;
      const float* q = in.q.data_ptr<float>();
      const float s = static_cast<float>(scale);
      exact_attention<D, float, float>(
          in, out.data_ptr<float>(), D,
          [&](int64_t at, float* dst, int64_t stride) {
            for (int64_t j = 0; j < D; ++j) dst[j * stride] = q[at + j] * s;
          },
          [](auto nv, auto... part) { exact_part<D, decltype(nv)::value>(part...); });
    };
    in.q.size(2) == 64 ? rows(std::integral_constant<int64_t, 64>{})
                       : rows(std::integral_constant<int64_t, 128>{});
  } else if (in.int8)
    in.q.size(2) == 64 ? run(int8_t{}, prefill<64, int8_t>) : run(int8_t{}, prefill<128, int8_t>);
  else
    in.q.size(2) == 64 ? run(float{}, prefill<64, float>) : run(float{}, prefill<128, float>);
  return out;
}
