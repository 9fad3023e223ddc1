// Vectors of the machine's own width (GCC vector extensions) for the kernels written over them, and
// the loads that widen a KV pool's row (fp32, bf16 or int8) into them: paged_attention.cpp
// (decode), prefill_attention.cpp's exact mode, prefill_attention_fp32.cpp and layer_ops.cpp (its
// own vector types, of L lanes); and the prefetch of a pool row ahead of its use.
#pragma once

#include <torch/extension.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

// lanes of one vector: the machine's own width. GCC splits wider vectors into the machine's, and
// lowers their two-source shuffles (paged_attention.cpp's reduce_lanes) one lane at a time where
// the CPU has no such instruction (AVX2)
#if defined(__AVX512F__)
constexpr int64_t L = 16;
#else
constexpr int64_t L = 8;
#endif
typedef float vec __attribute__((vector_size(L * sizeof(float))));
typedef uint16_t half_vec __attribute__((vector_size(L * sizeof(uint16_t))));
typedef uint32_t bits_vec __attribute__((vector_size(L * sizeof(uint32_t))));

// a * b + c rounded once, written out: the decode kernel's P.V must round as the bf16 prefill
// kernel's exact mode does (attention_parts.h), whatever -ffast-math would contract
inline vec fmadd(vec a, vec b, vec c) {
#if defined(__AVX512F__)
  return (vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

// a vector from any float address, and back
inline vec load_vec(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, vec v) { std::memcpy(p, &v, sizeof v); }

// a vector read from any float address (the pool's rows are 4-byte aligned)
typedef float unaligned_vec __attribute__((vector_size(L * sizeof(float)), aligned(4)));

// head_dim is a template parameter so that the loops over a row unroll into C whole vectors.
// Vector loads, not one memcpy of the row: GCC called memcpy for it (256 bytes) and the kernels
// then read the copy back from the stack
template <int64_t D>
inline void load_row(const float* src, vec* dst) {
  for (int64_t c = 0; c < D / L; ++c) dst[c] = *reinterpret_cast<const unaligned_vec*>(src + c * L);
}
// bf16 is the top half of an fp32: widen and shift
template <int64_t D>
inline void load_row(const at::BFloat16* src, vec* dst) {
  for (int64_t c = 0; c < D / L; ++c) {
    half_vec h;
    std::memcpy(&h, src + c * L, sizeof h);
    bits_vec bits = __builtin_convertvector(h, bits_vec) << 16;
    std::memcpy(&dst[c], &bits, sizeof bits);
  }
}

typedef int32_t index_vec __attribute__((vector_size(L * sizeof(int32_t))));
// int8 rows widen exactly to fp32 (their scale is applied by the caller). GCC's generic
// conversion of an int8 vector came out one lane at a time (2.3x the time of a bf16 pool per
// decode), so the widening is written with the CPU's own sign extension and conversion
template <int64_t D>
inline void load_row(const int8_t* src, vec* dst) {
  for (int64_t c = 0; c < D / L; ++c) {
#if defined(__AVX512F__)
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c * L));
    const __m512 wide = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    std::memcpy(&dst[c], &wide, sizeof wide);
#elif defined(__AVX2__)
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + c * L));
    const __m256 wide = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    std::memcpy(&dst[c], &wide, sizeof wide);
#else
    for (int64_t l = 0; l < L; ++l) dst[c][l] = static_cast<float>(src[c * L + l]);
#endif
  }
}

// How far ahead of the token being read a walk over a sequence's blocks asks for the K (or V)
// row it will read (decode attention; the bf16 prefill kernel's exact mode, key by key). Blocks
// lie anywhere in the pool, and the hardware prefetcher, which follows runs of misses, kept a
// 16-sequence step over scattered blocks at about 60% of the speed of one over consecutive blocks.
// On a Zen 4 EPYC, with 30 layers' pools read cold and blocks in random order, 16 and 64 sequences
// then took 0.75-0.78x the time (bf16; fp32 0.89-0.92x), one sequence over 900-2,000 tokens
// 0.73-0.87x; 4 or 16-32 tokens ahead did less, and whole blocks asked for as one starts less
// still (bench/RESULTS.md).
constexpr int64_t PREFETCH_TOKENS = 8;

inline void prefetch_bytes(const void* start, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64)
    _mm_prefetch(static_cast<const char*>(start) + at, _MM_HINT_T0);
}

}  // namespace
