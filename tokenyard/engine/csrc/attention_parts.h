// What decode attention (paged_attention.cpp) and the prefill kernels' exact modes
// (prefill_attention.cpp in bf16, prefill_attention_fp32.cpp) compute alike, so that a
// speculation's draft rows, run through an exact mode a sequence at a time, give the bits each
// would have as a lone decode: greedy output with and without speculation is then the same, where
// int8 activations would grow a last-bit difference in attention into a different token
// (bench/RESULTS.md, issue 17).
//
// A row attends to its context in parts of PART tokens cut by position. In each part: q . k, the
// products of lane l of a vector (dimensions l, l + L, … in fp32; bf16 pairs l, l + 16, … with
// vdpbf16ps) summed in one fixed tree (`tree_of`), times the scale (fp32: q comes scaled); the
// part's max; exps of the differences (glibc's vector expf, argument clamped to [-80, 0]); their
// sum, L partial sums by token position modulo L then the same tree; P.V as fp32 FMAs in token
// order from zero. Then the parts are merged by `merge_parts`. The adds that fix an order are
// written so that -ffast-math cannot reorder them (`add_in_order`).
#pragma once

#include <torch/extension.h>

#include "vectors.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// merges a row's parts (`parts` of them, `stride` slots apart: tops and totals one float a slot,
// sums `d` floats a slot) into the normalized row: weights exp(top - max) rescale each part; a part
// with a total of 0 (none of the row's tokens) is skipped. Defined once (paged_attention.cpp), so
// both kernels run the same instructions.
void merge_parts(const float* tops, const float* totals, const float* sums, int64_t parts,
                 int64_t stride, int64_t d, float* out);
void merge_parts(const float* tops, const float* totals, const float* sums, int64_t parts,
                 int64_t stride, int64_t d, at::BFloat16* out);

namespace {

// tokens a part holds (the last one of a row fewer). Parts are cut by token position alone, not by
// the batch's size or the thread count, so a row's sums come out in the same order whatever else is
// in the step. Below ~64 tokens merging parts costs more than a second thread saves.
constexpr int64_t PART = 64;

// An exact mode holds a run's rows (positions x the query heads of one KV head) in the lanes of at
// most this many vectors: a model with more query heads per KV head runs its drafts as decode
// rows (engine/attention.py)
constexpr int EXACT_VECTORS = 3;
constexpr int64_t EXACT_LANES = EXACT_VECTORS * L;

constexpr float EXP_FLOOR = -80.f;  // the vector exp takes a slow path for any lane below its range

// glibc's vector expf at the machine's width: what GCC calls for std::exp in a vectorized loop
// under -ffast-math
#if defined(__AVX512F__)
extern "C" __m512 _ZGVeN16v_expf(__m512);
inline vec vector_expf(vec x) { return (vec)_ZGVeN16v_expf((__m512)x); }
inline vec add_in_order(vec a, vec b) {
  return (vec)_mm512_add_round_ps((__m512)a, (__m512)b,
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#else
extern "C" __m256 _ZGVdN8v_expf(__m256);
inline vec vector_expf(vec x) { return (vec)_ZGVdN8v_expf((__m256)x); }
// AVX has no add with its own rounding mode: the empty asm makes the sum a value the compiler
// cannot look through, so it is neither reassociated nor merged with another add
inline vec add_in_order(vec a, vec b) {
  vec sum = a + b;
  asm("" : "+x"(sum));
  return sum;
}
#endif

// x[0] + … + x[L - 1] in the order paged_attention.cpp's reduce_lanes folds a vector's lanes:
// x[k] + x[k + L / 2] first, then those sums k and k + L / 4, and so on
inline vec tree_of(const vec* x) {
  vec t[L / 2];
  for (int64_t k = 0; k < L / 2; ++k) t[k] = add_in_order(x[k], x[k + L / 2]);
  for (int64_t h = L / 4; h >= 1; h /= 2)
    for (int64_t k = 0; k < h; ++k) t[k] = add_in_order(t[k], t[k + h]);
  return t[0];
}

// the same tree over the lanes of one vector: lane k gains lane k ^ h, h = L / 2, …, 1
struct LanePartners {
  index_vec at[L];  // at[h]
  LanePartners() {
    for (int64_t h = 1; h < L; h *= 2)
      for (int64_t k = 0; k < L; ++k) at[h][k] = static_cast<int32_t>(k ^ h);
  }
};
const LanePartners PARTNERS;

inline float lanes_tree_of(vec x) {
  for (int64_t h = L / 2; h >= 1; h /= 2) x = add_in_order(x, __builtin_shuffle(x, PARTNERS.at[h]));
  return x[0];
}

// where one KV head's rows lie in a pool of T: the exact modes read a part's keys in place
template <typename T>
struct HeadPool {
  const T *k, *v;
  const int32_t* table;
  int64_t block_size, kv_heads, head;
  // at[i]: key first + i's row of this head (in rows of D) for i < n, one division, not one a key;
  // the first rows' K and V asked for (the walk over them asks for the rest, `prefetch`)
  template <int64_t D>
  void rows_of(int64_t first, int64_t n, int64_t* at) const {
    int64_t block = first / block_size, offset = first % block_size;
    for (int64_t i = 0; i < n; ++i) {
      at[i] = (table[block] * block_size + offset) * kv_heads + head;
      if (++offset == block_size) offset = 0, ++block;
    }
    for (int64_t i = 0; i < std::min(n, PREFETCH_TOKENS); ++i) prefetch<D>(at[i]);
  }
  template <int64_t D>
  void prefetch(int64_t at) const {
    prefetch_bytes(k + at * D, D * static_cast<int64_t>(sizeof(T)));
    prefetch_bytes(v + at * D, D * static_cast<int64_t>(sizeof(T)));
  }
};

// exp(s - top) for the scores of a part whose max is top
inline vec part_exps(vec s, vec top) {
  vec x = s - top;
  x = x < EXP_FLOOR ? vec{} + EXP_FLOOR : x;
  x = x > 0.f ? vec{} : x;
  return vector_expf(x);
}

#if defined(__AVX512BF16__)

// add_in_order and friends as the bf16 kernels hold their floats (__m512; L is 16 there)
inline __m512 add_fixed(__m512 a, __m512 b) { return (__m512)add_in_order((vec)a, (vec)b); }

inline __m512 mul_fixed(__m512 a, __m512 b) {
  return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

inline __m512bh as_pairs(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// lane l's share of q . k for bf16 rows given as D / 32 vectors of 16 dimension pairs: pairs l,
// l + 16, … in that order
template <int64_t D>
inline __m512 pair_dots(const __m512i* q, const __m512i* k) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < D / 32; ++c) acc = _mm512_dpbf16_ps(acc, as_pairs(q[c]), as_pairs(k[c]));
  return acc;
}

#endif

}  // namespace
