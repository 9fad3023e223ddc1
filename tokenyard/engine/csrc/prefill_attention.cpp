// Prefill attention over the paged KV pool, for CPUs with AVX512-BF16: causal attention of each
// sequence's new chunk against its whole context (cached blocks and the chunk itself), bf16 in,
// fp32 sums, in the tiled online-softmax form of flash attention. Both matmuls run on vdpbf16ps
// (a pair of bf16 products per fp32 lane), which is why this beats PyTorch's CPU flash kernel:
// the same instruction is what oneDNN's bf16 matmuls reach ~190 GFLOP/s per core with.
//
// Three passes, all parallel: (1) every key tile of every (sequence, KV head) is read once
// through the block table and packed into the pair-interleaved layout vdpbf16ps wants; (2) each
// work item -- a sequence, a KV head and a run of query positions, for all the query heads that
// share the KV head -- walks its key tiles; (3) the results are normalized into the output. A
// step of few items (a speculating sequence's 1 + n tokens over its context: 3 runs for 2
// threads here) cuts each run's key tiles into parts that run apart, their running max, sum of
// exps and unnormalized sums merged in (3), as flash-decoding does. P is rounded to bf16 for the
// P.V product, as flash attention does on GPUs and PyTorch's CPU kernel does for bf16. An int8
// pool's tiles are dequantized to bf16 (each row times its scale) as they are packed.
//
// Exact mode (a speculating sequence's rows: each as a lone decode computes it, to the bit) skips
// pass 1: its few rows sit in vector lanes and read each key in place (`attend_part` below).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "attention_parts.h"
#include "prefill_inputs.h"
#include "vectors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace {

static_assert(L == 16, "vectors.h's vectors are a zmm register's 16 floats here");

constexpr int64_t KT = 32;        // keys per tile: two vectors of scores
constexpr int64_t M = 32;         // query positions per work item
constexpr int64_t RB = 4;         // rows per register block
constexpr float MASKED = -1e30f;  // finite: built with -ffast-math, which assumes no infinities

// query positions [first, first + count) of a sequence, for the query heads of one KV head;
// `parts` pieces of its key tiles, each with `padded` rows of partial results from `slot` on
struct Run {
  int64_t seq, head, first, count, parts, slot, padded;
};

struct Item {
  // one part of a run: its key tiles [lo, hi)
  int64_t run, part, lo, hi;
};

// key tiles a part holds at least: below this, merging parts costs more than a thread saves
constexpr int64_t MIN_PART_TILES = 2;

// scores s[r][n] = q_r . k_n for RB rows against one tile (rows past `rows` use a zero row)
template <int64_t D>
inline void scores(const uint32_t* const* q, const uint32_t* k, float scale, float* s) {
  __m512 acc[RB][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
  for (int64_t j = 0; j < D / 2; ++j) {
    const __m512i k0 = _mm512_loadu_si512(k + j * KT), k1 = _mm512_loadu_si512(k + j * KT + 16);
    for (int64_t r = 0; r < RB; ++r) {
      const __m512i qj = _mm512_set1_epi32(static_cast<int>(q[r][j]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], as_pairs(qj), as_pairs(k0));
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], as_pairs(qj), as_pairs(k1));
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < RB; ++r) {
    _mm512_storeu_ps(s + r * KT, _mm512_mul_ps(acc[r][0], sc));
    _mm512_storeu_ps(s + r * KT + 16, _mm512_mul_ps(acc[r][1], sc));
  }
}

// o[r] = o[r] * alpha[r] + sum_n p[r][n] v_n for RB rows, P in bf16 pairs (vdpbf16ps)
template <int64_t D>
inline void accumulate(const uint32_t* p, const uint32_t* v, const float* alpha, float* o) {
  constexpr int64_t C = D / 16;
  __m512 acc[RB][C];
  for (int64_t r = 0; r < RB; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int64_t c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * D + c * 16), a);
  }
  for (int64_t m = 0; m < KT / 2; ++m) {
    __m512i vm[C];  // keys 2m (the low halves) and 2m + 1, pairwise
    for (int64_t c = 0; c < C; ++c) vm[c] = _mm512_loadu_si512(v + m * D + c * 16);
    for (int64_t r = 0; r < RB; ++r) {
      const __m512i pm = _mm512_set1_epi32(static_cast<int>(p[r * KT / 2 + m]));
      for (int64_t c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_pairs(pm), as_pairs(vm[c]));
    }
  }
  for (int64_t r = 0; r < RB; ++r)
    for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(o + r * D + c * 16, acc[r][c]);
}

// keys past the context read as zeros (their scores are masked; their values weigh 0), and so do
// the query rows that pad a run to whole register blocks
alignas(64) constexpr uint16_t ZERO_ROW[128] = {};

// the rows of keys [first, first + KT) of a (sequence, KV head), read through the block table
inline void tile_rows(const uint16_t* cache, const int32_t* table, int64_t block_size, int64_t row,
                      int64_t first, int64_t keys, const uint16_t** rows) {
  // one division for the tile, not one a key: the block size is known only at run time
  int64_t block = first / block_size, offset = first % block_size;
  for (int64_t n = 0; n < KT; ++n) {
    rows[n] = first + n < keys ? cache + (table[block] * block_size + offset) * row : ZERO_ROW;
    if (++offset == block_size) offset = 0, ++block;
  }
}

// an int8 pool row of one KV head (`at`, in rows of D) times its scale, rounded to bf16
template <int64_t D>
inline void dequantize_row(const int8_t* cache, const float* scales, int64_t at, uint16_t* dst) {
  vec x[D / L];
  load_row<D>(cache + at * D, x);
  for (int64_t c = 0; c < D / L; ++c) {
    const __m256bh h = _mm512_cvtneps_pbh(reinterpret_cast<__m512>(x[c] * scales[at]));
    std::memcpy(dst + c * L, &h, sizeof h);
  }
}

// the same rows from an int8 pool: each dequantized into `local` [KT, D]; keys past the context
// read ZERO_ROW as above
template <int64_t D>
inline void dequantized_rows(const int8_t* cache, const float* scales, const int32_t* table,
                             int64_t block_size, int64_t kv_heads, int64_t head, int64_t first,
                             int64_t keys, uint16_t* local, const uint16_t** rows) {
  int64_t block = first / block_size, offset = first % block_size;
  for (int64_t n = 0; n < KT; ++n) {
    rows[n] = ZERO_ROW;
    if (first + n < keys) {
      const int64_t at = (table[block] * block_size + offset) * kv_heads + head;
      dequantize_row<D>(cache, scales, at, local + n * D);
      rows[n] = local + n * D;
    }
    if (++offset == block_size) offset = 0, ++block;
  }
}

// c[j] = (r[0][j], ..., r[15][j]): a 16 x 16 transpose of 32-bit words in registers (pairs of
// words, then pairs of pairs, within 128-bit lanes; then the lanes)
inline void transpose16(const __m512i (&r)[16], __m512i (&c)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // b[i + k], lane L: rows i..i+3 of word 4L + k
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x44),
                  x1 = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xEE),
                  y0 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x44),
                  y1 = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xEE);
    c[k] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    c[4 + k] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    c[8 + k] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    c[12 + k] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// kp[j][n]: key n's pair of dimensions (2j, 2j + 1), the tile transposed 16 x 16 at a time
template <int64_t D>
void pack_keys(const uint16_t* const* rows, uint32_t* kp) {
  for (int64_t n0 = 0; n0 < KT; n0 += 16)
    for (int64_t j0 = 0; j0 < D / 2; j0 += 16) {
      __m512i r[16], c[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows[n0 + i] + 2 * j0);
      transpose16(r, c);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(kp + (j0 + j) * KT + n0, c[j]);
    }
}

// vp[m][d]: keys 2m and 2m + 1's dimension d, as one pair
template <int64_t D>
void pack_values(const uint16_t* const* rows, uint32_t* vp) {
  for (int64_t m = 0; m < KT / 2; ++m)
    for (int64_t d = 0; d < D; d += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                        reinterpret_cast<const __m256i*>(rows[2 * m] + d))),
                    hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                        reinterpret_cast<const __m256i*>(rows[2 * m + 1] + d)));
      _mm512_storeu_si512(vp + m * D + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

// ------------------------------------------------------------------ exact mode
// A speculating sequence's rows (its last token and draft) attend as lone decodes do, to the bit:
// the arithmetic of attention_parts.h, which the decode kernel runs too (a last-bit difference
// grows through int8 activations into a different greedy token). They are few rows against a
// whole context, which the packed form serves badly: it packs every key tile for them. Here a
// run's rows (positions x the query heads of one KV head, up to 48) sit in the lanes of NV
// vectors instead: each key row, read in place through the block table, is broadcast a pair of
// dimensions at a time against the transposed queries (vdpbf16ps), the 16 products a decode row's
// vector lanes would hold kept apart and summed in the decode kernel's tree, so that the scores,
// the softmax's max, exps and sums run across lanes with no horizontal reduction. P.V stays fp32:
// each key's values widened once, one FMA per row and 16 dimensions. A bf16 pool only: an int8
// pool's draft rows run as decode rows (engine/attention.py).

// one key's scores against 16 NV rows (qt[(j * NV + v) * 16 + lane]: row 16 v + lane's dimensions
// 2j and 2j + 1 as one pair), its row given as D / 2 pairs: lane l of a decode row's products
// (pairs l, l + 16, …) for each l, then attention_parts.h's tree
template <int64_t D, int NV>
inline void key_scores(const uint32_t* qt, const uint32_t* k, __m512 scale, __m512 (&s)[NV]) {
  auto lane = [&](int64_t l, __m512 (&x)[NV]) {  // lane l's products, for the NV vectors of rows
    for (int v = 0; v < NV; ++v) x[v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < D / 32; ++c) {
      const int64_t j = c * 16 + l;
      const __m512bh pair = as_pairs(_mm512_set1_epi32(static_cast<int>(k[j])));
      for (int v = 0; v < NV; ++v)
        x[v] = _mm512_dpbf16_ps(x[v], as_pairs(_mm512_loadu_si512(qt + (j * NV + v) * 16)), pair);
    }
  };
  // tree_of's order, its lanes made as they are summed (few registers live)
  __m512 t4[4][NV];
  for (int64_t k4 = 0; k4 < 4; ++k4) {
    __m512 a[NV], b[NV], c[NV], d[NV];
    lane(k4, a);
    lane(k4 + 8, b);
    lane(k4 + 4, c);
    lane(k4 + 12, d);
    for (int v = 0; v < NV; ++v)
      t4[k4][v] = add_fixed(add_fixed(a[v], b[v]), add_fixed(c[v], d[v]));
  }
  for (int v = 0; v < NV; ++v)
    s[v] = mul_fixed(add_fixed(add_fixed(t4[0][v], t4[2][v]), add_fixed(t4[1][v], t4[3][v])),
                     scale);
}

// A run's rows (qt: transposed as key_scores reads them; limit: the last key each sees) against
// the part of keys [lo, hi) (lo a multiple of PART, hi - lo at most PART): each row's max `top`,
// sum of exps `total` and unnormalized sums `o` [16 NV, D] over the keys it sees, as the decode
// kernel's part has them
template <int64_t D, int NV>
void attend_part(const uint32_t* qt, const int64_t* limit, int64_t rows,
                 const HeadPool<uint16_t>& pool, int64_t lo, int64_t hi, float scale, float* o,
                 float* top, float* total) {
  constexpr int64_t W = NV * 16, C = D / 16, RBX = 16 / C;  // RBX rows: 16 accumulators
  const int64_t n = hi - lo;
  int64_t at[PART];  // the part's rows
  pool.template rows_of<D>(lo, n, at);
  alignas(64) float p[PART][W];
  vec vf[PART][D / L];  // the part's values
  __mmask16 seen[PART][NV];
  __m512i last[NV];  // padding lanes see no key
  __m512 best[NV];
  for (int v = 0; v < NV; ++v) {
    alignas(64) int32_t l[16];
    for (int64_t i = 0; i < 16; ++i)
      l[i] = 16 * v + i < rows ? static_cast<int32_t>(limit[16 * v + i]) : -1;
    last[v] = _mm512_load_si512(l);
    best[v] = _mm512_set1_ps(MASKED);
  }
  const __m512 sc = _mm512_set1_ps(scale);
  // scores, and the max of the ones each row sees
  for (int64_t t = 0; t < n; ++t) {
    if (t + PREFETCH_TOKENS < n) pool.template prefetch<D>(at[t + PREFETCH_TOKENS]);
    __m512 s[NV];
    key_scores<D, NV>(qt, reinterpret_cast<const uint32_t*>(pool.k + at[t] * D), sc, s);
    const __m512i key = _mm512_set1_epi32(static_cast<int>(lo + t));
    for (int v = 0; v < NV; ++v) {
      seen[t][v] = _mm512_cmple_epi32_mask(key, last[v]);
      best[v] = _mm512_mask_max_ps(best[v], seen[t][v], best[v], s[v]);
      _mm512_store_ps(p[t] + 16 * v, s[v]);
    }
    load_row<D>(reinterpret_cast<const at::BFloat16*>(pool.v + at[t] * D), vf[t]);
  }
  // probabilities (a key a row does not see weighs 0), summed by position modulo 16
  __m512 by_lane[16][NV];
  for (auto& b : by_lane)
    for (auto& x : b) x = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t)
    for (int v = 0; v < NV; ++v) {
      const __m512 e =
          _mm512_maskz_mov_ps(seen[t][v], (__m512)part_exps((vec)_mm512_load_ps(p[t] + 16 * v),
                                                            (vec)best[v]));
      _mm512_store_ps(p[t] + 16 * v, e);
      by_lane[t % 16][v] = add_fixed(by_lane[t % 16][v], e);
    }
  for (int v = 0; v < NV; ++v) {
    __m512 lanes[16];
    for (int64_t l = 0; l < 16; ++l) lanes[l] = by_lane[l][v];
    _mm512_storeu_ps(total + 16 * v, (__m512)tree_of(reinterpret_cast<const vec*>(lanes)));
    _mm512_storeu_ps(top + 16 * v, best[v]);
  }
  // P.V: RBX rows at a time against each key's widened values, from zero
  for (int64_t r0 = 0; r0 < rows; r0 += RBX) {
    __m512 acc[RBX][C];
    for (auto& a : acc)
      for (auto& x : a) x = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < RBX; ++r) {
        const __m512 pr = _mm512_set1_ps(p[t][r0 + r]);
        for (int64_t c = 0; c < C; ++c)
          acc[r][c] = _mm512_fmadd_ps(pr, reinterpret_cast<__m512>(vf[t][c]), acc[r][c]);
      }
    for (int64_t r = 0; r < RBX; ++r)
      for (int64_t c = 0; c < C; ++c) _mm512_storeu_ps(o + (r0 + r) * D + c * 16, acc[r][c]);
  }
}

// k_cache, v_cache: bf16, or int8 with k_scales and v_scales (null for bf16)
template <int64_t D>
void prefill(const uint16_t* q, const void* k_cache, const void* v_cache, const float* k_scales,
             const float* v_scales, const int32_t* tables, const int32_t* starts,
             const int32_t* context_lens, uint16_t* out, int64_t seqs, int64_t q_heads,
             int64_t kv_heads, int64_t block_size, int64_t max_blocks, float scale) {
  const int64_t group = q_heads / kv_heads, row = kv_heads * D, tile_words = KT * D / 2;
  // pass 1: pack every key tile of every (sequence, KV head)
  const std::vector<int64_t> tile_base = tile_bases(context_lens, seqs, KT);
  const int64_t tiles = tile_base[seqs];
  // written whole below: left uninitialized
  std::unique_ptr<uint32_t[]> packed_k(new uint32_t[tiles * kv_heads * tile_words]),
      packed_v(new uint32_t[tiles * kv_heads * tile_words]);
  auto pack = [&](int64_t i, int64_t s, int64_t h, int64_t first_key) {
    const int32_t* table = tables + s * max_blocks;
    const uint16_t* rows[KT];
    alignas(64) uint16_t local[KT * D];  // an int8 tile's rows in bf16
    auto read = [&](const void* cache, const float* scales) {
      if (scales == nullptr)
        tile_rows(static_cast<const uint16_t*>(cache) + h * D, table, block_size, row, first_key,
                  context_lens[s], rows);
      else
        dequantized_rows<D>(static_cast<const int8_t*>(cache), scales, table, block_size,
                            kv_heads, h, first_key, context_lens[s], local, rows);
    };
    read(k_cache, k_scales);
    pack_keys<D>(rows, packed_k.get() + i * tile_words);
    read(v_cache, v_scales);
    pack_values<D>(rows, packed_v.get() + i * tile_words);
  };
  each_tile(tile_base, kv_heads, KT, pack);
  // pass 2: runs of query positions, each cut into parts when there are few to share out
  std::vector<Run> runs;
  int64_t slots = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t num_new = starts[s + 1] - starts[s];
    for (int64_t first = 0; first < num_new; first += M)
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t count = std::min(M, num_new - first);
        runs.push_back({s, h, first, count, 1, 0, (count * group + RB - 1) / RB * RB});
      }
  }
  // about 4 items a thread, their count a multiple of the threads' (a speculating sequence's 3
  // runs in 3 parts each left one thread idle for the ninth item)
  const int64_t threads = at::get_num_threads(), num_runs = static_cast<int64_t>(runs.size());
  int64_t split = 1;
  if (num_runs < 4 * threads) {
    split = (4 * threads + num_runs - 1) / num_runs;
    while (split * num_runs % threads != 0) ++split;
  }
  std::vector<Item> items;
  for (int64_t r = 0; r < num_runs; ++r) {
    Run& run = runs[r];
    const int64_t cached = context_lens[run.seq] - (starts[run.seq + 1] - starts[run.seq]);
    const int64_t keys = cached + run.first + run.count;  // the keys the run's last row sees
    const int64_t tiles = (keys + KT - 1) / KT;
    run.parts = std::max<int64_t>(1, std::min(split, tiles / MIN_PART_TILES));
    run.slot = slots;
    slots += run.parts * run.padded;
    for (int64_t p = 0; p < run.parts; ++p)
      items.push_back({r, p, tiles * p / run.parts, tiles * (p + 1) / run.parts});
  }
  // where a run's row (position first + row / group, query head row % group of its KV head's)
  // lies in q, and in the output, in elements
  auto row_at = [&](const Run& run, int64_t row) {
    const int64_t i = run.first + row / group, g = row % group;
    return ((starts[run.seq] + i) * q_heads + run.head * group + g) * D;
  };
  // the most work first, so that the threads finish together
  auto work = [&](const Item& it) { return (it.hi - it.lo) * runs[it.run].padded; };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Item& a, const Item& b) { return work(a) > work(b); });
  std::vector<float> o_all(slots * D, 0.f), top_all(slots, MASKED), total_all(slots, 0.f);
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
  for (int64_t w = 0; w < num_items; ++w) {
    const Item& it = items[w];
    const Run& run = runs[it.run];
    const int64_t rows = run.count * group, blocks = run.padded / RB;
    const int64_t cached = context_lens[run.seq] - (starts[run.seq + 1] - starts[run.seq]);
    std::vector<const uint32_t*> qr(run.padded, reinterpret_cast<const uint32_t*>(ZERO_ROW));
    std::vector<int64_t> limit(run.padded, -1);  // the last key each row sees (padding: none)
    for (int64_t r = 0; r < rows; ++r) {
      qr[r] = reinterpret_cast<const uint32_t*>(q + row_at(run, r));
      limit[r] = cached + run.first + r / group;
    }
    const int64_t slot = run.slot + it.part * run.padded;
    float *o = &o_all[slot * D], *top = &top_all[slot], *total = &total_all[slot];
    std::vector<float> s(RB * KT), alpha(RB);
    std::vector<uint32_t> p(RB * KT / 2);
    const int64_t tile0 = (tile_base[run.seq] * kv_heads) + run.head;  // tiles are head-interleaved
    for (int64_t kt = it.lo; kt < it.hi; ++kt) {
      const uint32_t* kp = packed_k.get() + (tile0 + kt * kv_heads) * tile_words;
      const uint32_t* vp = packed_v.get() + (tile0 + kt * kv_heads) * tile_words;
      const int64_t k0 = kt * KT;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = b * RB;
        if (limit[std::min(r0 + RB, rows) - 1] < k0) continue;  // the whole tile is in the future
        scores<D>(&qr[r0], kp, scale, s.data());
        for (int64_t r = 0; r < RB; ++r) {
          float* sr = s.data() + r * KT;
          const int64_t visible = std::clamp<int64_t>(limit[r0 + r] - k0 + 1, 0, KT);
          if (visible == 0) {  // nothing of this tile yet: the row's sums stay as they are
            std::memset(p.data() + r * KT / 2, 0, KT / 2 * sizeof(uint32_t));
            std::memset(sr, 0, KT * sizeof(float));
            alpha[r] = 1.f;
            continue;
          }
          alpha[r] = tile_probabilities<KT>(sr, visible, top[r0 + r], total[r0 + r]);
          const __m512bh lo_hi =
              _mm512_cvtne2ps_pbh(_mm512_loadu_ps(sr + 16), _mm512_loadu_ps(sr));
          std::memcpy(p.data() + r * KT / 2, &lo_hi, sizeof lo_hi);
        }
        accumulate<D>(p.data(), vp, alpha.data(), o + r0 * D);
      }
    }
  }
  // pass 3: each row's parts merged, normalized, rounded (attention_parts.h)
  at::parallel_for(0, num_runs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const Run& run = runs[r];
      for (int64_t row = 0; row < run.count * group; ++row) {
        const int64_t first = run.slot + row;
        merge_parts(&top_all[first], &total_all[first], &o_all[first * D], run.parts, run.padded,
                    D, reinterpret_cast<at::BFloat16*>(out + row_at(run, row)));
      }
    }
  });
}

}  // namespace

// q: [T, Hq, D] bf16, the new tokens of every sequence back to back; k_cache, v_cache:
// [num_blocks, block_size, Hkv, D] bf16 holding every sequence's context, the new tokens
// included (or int8, with k_scales and v_scales [num_blocks, block_size, Hkv] fp32); block_tables: [S, W] int32; starts: [S + 1] int32 (sequence s's rows of q are
// [starts[s], starts[s+1])); context_lens: [S] int32. Query j of sequence s sits at position
// context_lens[s] - (its new tokens) + j and sees keys 0..that position. Returns [T, Hq, D].
torch::Tensor paged_prefill_bf16(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                 torch::Tensor block_tables, torch::Tensor starts,
                                 torch::Tensor context_lens, double scale, bool exact,
                                 c10::optional<torch::Tensor> k_scales,
                                 c10::optional<torch::Tensor> v_scales) {
  const PrefillInputs in = prefill_inputs(q, k_cache, v_cache, block_tables, starts, context_lens,
                                          k_scales, v_scales, torch::kBFloat16);
  TORCH_CHECK(!exact || in.q.size(1) / in.k_cache.size(2) <= EXACT_LANES,
              "exact mode takes at most ", EXACT_LANES, " query heads per KV head");
  TORCH_CHECK(!exact || !in.int8,
              "exact mode reads a bf16 pool (an int8 one's drafts: decode rows)");
  auto out = torch::empty_like(in.q);
  auto ptr = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
  auto run = [&](auto fn) {
    fn(ptr(in.q), in.k_cache.data_ptr(), in.v_cache.data_ptr(),
       in.int8 ? in.k_scales.data_ptr<float>() : nullptr,
       in.int8 ? in.v_scales.data_ptr<float>() : nullptr, in.block_tables.data_ptr<int32_t>(),
       in.starts.data_ptr<int32_t>(), in.context_lens.data_ptr<int32_t>(), ptr(out),
       in.block_tables.size(0), in.q.size(1), in.k_cache.size(2), in.k_cache.size(1),
       in.block_tables.size(1), static_cast<float>(scale));
  };
  if (exact) {
    auto rows = [&](auto d) {  // q's dimension pairs, then attend_part
      constexpr int64_t D = decltype(d)::value;
      const auto* q = reinterpret_cast<const uint32_t*>(ptr(in.q));
      const float s = static_cast<float>(scale);
      exact_attention<D, uint32_t, uint16_t>(
          in, reinterpret_cast<at::BFloat16*>(ptr(out)), D / 2,
          [&](int64_t at, uint32_t* dst, int64_t stride) {
            for (int64_t j = 0; j < D / 2; ++j) dst[j * stride] = q[at / 2 + j];
          },
          [&](auto nv, const uint32_t* qt, const int64_t* limit, int64_t rows,
              const HeadPool<uint16_t>& pool, int64_t lo, int64_t hi, float* o, float* top,
              float* total) {
            attend_part<D, decltype(nv)::value>(qt, limit, rows, pool, lo, hi, s, o, top, total);
          });
    };
    in.q.size(2) == 64 ? rows(std::integral_constant<int64_t, 64>{})
                       : rows(std::integral_constant<int64_t, 128>{});
  } else {
    in.q.size(2) == 64 ? run(prefill<64>) : run(prefill<128>);
  }
  return out;
}

#endif
