// What decode attention (paged_attention.cpp) and the bf16 prefill kernel's exact mode
// (prefill_attention.cpp) compute alike, so that a speculation's draft rows, run through the exact
// mode a sequence at a time, give the bits each would have as a lone decode: greedy output with and
// without speculation is then the same in bf16, where int8 activations would grow a last-bit
// difference in attention into a different token (bench/RESULTS.md, issue 17).
//
// A row attends to its context in parts of PART tokens cut by position. In each part: q . k in bf16
// pairs (vdpbf16ps), lane l of a vector holding pairs l, l + 16, … of the head dimension, the lanes
// summed in one fixed tree, times the scale; the part's max; exps of the differences (glibc's
// vector expf, argument clamped to [-80, 0]); their sum, 16 partial sums by token position modulo
// 16 then the same tree; P.V as fp32 FMAs in token order from zero. Then the parts are merged by
// `merge_parts`. The adds that fix an order are written with an explicit rounding mode, which
// -ffast-math does not let the compiler reorder.
#pragma once

#include <torch/extension.h>

#include <immintrin.h>

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

#if defined(__AVX512BF16__)

constexpr float EXP_FLOOR = -80.f;  // the vector exp takes a slow path for any lane below its range

// glibc's vector expf: what GCC calls for std::exp in a vectorized loop under -ffast-math
extern "C" __m512 _ZGVeN16v_expf(__m512);

inline __m512 add_fixed(__m512 a, __m512 b) {
  return _mm512_add_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

inline __m512 mul_fixed(__m512 a, __m512 b) {
  return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// x[0] + … + x[15] as ((x0 + x8) + (x4 + x12)) + ((x2 + x10) + (x6 + x14)) plus the same of the odd
// ones: the tree in which paged_attention.cpp's reduce_lanes folds a vector's lanes
inline __m512 tree16(const __m512* x) {
  __m512 t8[8], t4[4];
  for (int k = 0; k < 8; ++k) t8[k] = add_fixed(x[k], x[k + 8]);
  for (int k = 0; k < 4; ++k) t4[k] = add_fixed(t8[k], t8[k + 4]);
  return add_fixed(add_fixed(t4[0], t4[2]), add_fixed(t4[1], t4[3]));
}

// the same tree over the lanes of one vector
inline float lanes_tree(__m512 x) {
  const __m512 t8 = add_fixed(x, _mm512_shuffle_f32x4(x, x, 0x4E));     // lane k + lane k + 8
  const __m512 t4 = add_fixed(t8, _mm512_shuffle_f32x4(t8, t8, 0xB1));  // + lane k + 4
  const __m512 t2 = add_fixed(t4, _mm512_permute_ps(t4, 0x4E));         // + lane k + 2
  return _mm512_cvtss_f32(add_fixed(t2, _mm512_permute_ps(t2, 0xB1)));  // + lane k + 1
}

// exp(s - top) for the scores of a part whose max is top
inline __m512 part_exp(__m512 s, __m512 top) {
  const __m512 x = _mm512_sub_ps(s, top);
  return _ZGVeN16v_expf(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_FLOOR)),
                                      _mm512_setzero_ps()));
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
