// Matmuls on block-quantized weights for CPUs: y[M, N] = x[M, K] @ W[N, K]^T, reading each 4- or
// 8-bit weight once. Decode steps multiply a few rows by every weight of the model; speculation's
// verify steps and small batches multiply 2-16. Both want few instructions per weight and row.
//
// Weights come in panels of 16 rows (engine/quant.py `to_panels`), one row per int32 lane of an
// AVX-512 register, in blocks of 32 weights along K with a scale per block (per 16 for Q6_K) in
// fp16 where that is exact (GGUF's own scales, as shipped) or else fp32:
//   q4: w = d * q + m, q in 0..15. A block is 4 chunks of 64 bytes; chunk c, lane j, byte t holds
//       row j's weight 8c + t in its low nibble and 8c + 4 + t in its high one. Then d[16], m[16].
//   q8: w = d * q, q int8. A block is 8 chunks of 64 bytes; chunk c, lane j, byte t: row j's
//       weight 4c + t. Then d[16] (d[2][16] for groups of 16).
// Activations are quantized per row in blocks of 32 to int8 (a = s * qa, |qa| <= 127). One vpdpbusd
// multiplies a chunk by 4 activations broadcast to every lane: 16 rows' partial sums at once, so
// a block costs 8 dot instructions and one conversion + scaling for 16 rows (the row-major layout
// this replaces needed a conversion and scaling for every row: 3-4 instructions per 64 weights and
// row against about one here; bench/RESULTS.md, issue 17). The unpacked chunks serve several
// activation rows from registers (MR_* below).
//
// vpdpbusd takes unsigned x signed bytes: q4 weights are unsigned; q8 weights are made unsigned
// (q + 128, one xor a chunk) and 128 * sum(qa) comes off each block's int32 sum. AVX2 (no VNNI)
// runs the same layout as two halves of 8 rows with vpmaddubsw + vpmaddwd (exact: pairs of
// products stay below 2^15, q8 by moving the weight's sign onto the activation). Both paths are
// compiled whatever the build machine (function target attributes) and picked at run time by the
// caller (`isa`: 2 = AVX-512 VNNI, 1 = AVX2), so tests can force the AVX2 one.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t QB = 32;  // weights per block, and per activation block
constexpr int64_t PW = 16;  // weight rows per panel
// Activation rows that share one pass over a panel, at most MR. AVX-512's q4 passes take 16: its 32
// zmm registers hold a block's 8 unpacked chunks and 16 accumulators, so a speculation's 9-row
// verify step or a 16-row batch reads and unpacks each panel once, not in passes of 8 + 1 or 8 + 8
// (9-24 rows 0.88-0.95x the time on a Zen 4 EPYC, 1-8 rows alike; bench/RESULTS.md). So do its
// q8 passes, since the weights are prefetched (the tied LM head at 9-16 rows 0.90-0.96x the time
// of passes of 8, Q6_K's groups of 16 0.85-0.91x; no faster before). AVX2's q4 passes take 4: its
// 16 ymm registers hold a half block's 8 unpacked weight vectors, and 8 accumulators beside them
// spill (16-row steps 9% faster in passes of 4 than of 8 on a Zen 3 EPYC); its q8 passes, which
// spill either way, take 8 (4 gained nothing there).
constexpr int MR_VNNI_Q4 = 16;
constexpr int MR_VNNI_Q8 = 16;
constexpr int MR_AVX2_Q4 = 4;
constexpr int MR_AVX2_Q8 = 8;
constexpr int MR = 16;  // the most of any path

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define VNNI_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

// Activations quantized per block of 32: qa (int8), the block's scale s, s * sum(qa), and the
// integer sums of qa over each half block (q8's correction).
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
  std::vector<int32_t> half;
  int64_t blocks;
  const int8_t* row(int64_t m) const { return q.data() + m * blocks * QB; }
  const float* s(int64_t m) const { return scale.data() + m * blocks; }
  const float* ssum(int64_t m) const { return sum.data() + m * blocks; }
  const int32_t* halves(int64_t m) const { return half.data() + m * blocks * 2; }
};

// 8 floats from fp32 or bf16 (bf16 is fp32's upper half: a shift)
AVX2_TARGET inline __m256 load_floats(const float* p) { return _mm256_loadu_ps(p); }
AVX2_TARGET inline __m256 load_floats(const at::BFloat16* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

AVX2_TARGET inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

AVX2_TARGET inline int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// Vectorized (AVX2, which every machine running these kernels has) because a decode step
// quantizes every projection's input: element by element, with bf16 inputs, it cost ~3 ms of a
// batch-1 step (bench/RESULTS.md, issue 17). Same arithmetic as the reference: s = amax / 127,
// qa = nearest-even(x * (127 / amax)).
template <typename T>
AVX2_TARGET void quantize_block(const T* x, int64_t i, QuantRows& out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = load_floats(x + i * QB + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
  }
  const float top = hmax256(amax), s = top / 127.f, inv = top > 0.f ? 127.f / top : 0.f;
  __m256i q[4];
  for (int k = 0; k < 4; ++k)
    q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(inv)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const int32_t halves[2] = {hsum256(_mm256_add_epi32(q[0], q[1])),
                             hsum256(_mm256_add_epi32(q[2], q[3]))};
  // int32 -> int8 in order: the packs interleave 128-bit lanes, the permute undoes it
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered =
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + i * QB), ordered);
  out.scale[i] = s;
  out.sum[i] = s * static_cast<float>(halves[0] + halves[1]);
  out.half[i * 2] = halves[0];
  out.half[i * 2 + 1] = halves[1];
}

template <typename T>
QuantRows quantize_rows(const T* x, int64_t M, int64_t K) {
  const int64_t nb = K / QB;
  QuantRows out{std::vector<int8_t>(M * K), std::vector<float>(M * nb),
                std::vector<float>(M * nb), std::vector<int32_t>(M * nb * 2), nb};
  at::parallel_for(0, M * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) quantize_block(x, i, out);
  });
  return out;
}

// n outputs to y in its dtype; bf16 rounded to nearest even as at::BFloat16 rounds (8 at a time:
// element by element it was a visible part of a decode step)
inline void store_outputs(float* y, const float* out, int64_t n) {
  std::memcpy(y, out, n * sizeof(float));
}
AVX2_TARGET inline void store_outputs(at::BFloat16* y, const float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(out + j);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded),
                                            _mm256_extracti128_si256(rounded, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j), packed);
  }
  for (; j < n; ++j) y[j] = static_cast<at::BFloat16>(out[j]);
}

// 4 activations as one int32, to broadcast to every lane
inline int32_t word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Each block asks for the weights PREFETCH bytes ahead of it: the rest of its panel, then the next
// panel, which the same thread takes next. The hardware prefetcher alone kept the weight stream
// behind the dot products: with this, on a Zen 4 EPYC a one-row q4 matmul (SmolLM2's gate_up)
// took 0.69-0.80x the time and the Q8_0 LM head at 8-32 rows 0.74-0.83x (bench/RESULTS.md).
// Addresses past the weights' end are only prefetched, never read (a prefetch does not fault).
constexpr int64_t PREFETCH = 4096;

template <int64_t BYTES>
inline void prefetch_ahead(const void* block) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(block) + PREFETCH;
  for (int64_t line = 0; line < BYTES; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(at + line), _MM_HINT_T0);
}

// ------------------------------------------------------------------ AVX-512 VNNI

VNNI_TARGET inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
VNNI_TARGET inline __m512 load16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// sum over chunks [c0, c1) of w[c] . x[4c..4c+3], in two chains so the dot products overlap
template <int C0, int C1>
VNNI_TARGET inline __m512i dot_chunks(const __m512i (&w)[8], const int8_t* x) {
  __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
  for (int c = C0; c < C1; c += 2) {
    even = _mm512_dpbusd_epi32(even, w[c], _mm512_set1_epi32(word(x + 4 * c)));
    odd = _mm512_dpbusd_epi32(odd, w[c + 1], _mm512_set1_epi32(word(x + 4 * c + 4)));
  }
  return _mm512_add_epi32(even, odd);
}

// out[r][j]: panel row j times activation row m0 + r, for R rows
template <int R, typename S>
VNNI_TARGET void q4_panel_vnni(const uint8_t* qs, const S* d, const S* mn, int64_t nb,
                               const QuantRows& a, int64_t m0, float (*out)[PW]) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_ahead<256>(qs + b * 256);
    __m512i w[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(qs + b * 256 + 64 * c);
      w[2 * c] = _mm512_and_si512(v, low);
      w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    const __m512 wd = load16(d + b * PW), wm = load16(mn + b * PW);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_cvtepi32_ps(dot_chunks<0, 8>(w, a.row(m0 + r) + b * QB));
      acc[r] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, _mm512_set1_ps(a.s(m0 + r)[b])), acc[r]);
      acc[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(a.ssum(m0 + r)[b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

// G scale groups a block: 1 (groups of 32) or 2 (Q6_K's groups of 16)
template <int R, int G, typename S>
VNNI_TARGET void q8_panel_vnni(const int8_t* qs, const S* d, int64_t nb, const QuantRows& a,
                               int64_t m0, float (*out)[PW]) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_ahead<512>(qs + b * 512);
    __m512i w[8];
    for (int c = 0; c < 8; ++c)
      w[c] = _mm512_xor_si512(_mm512_loadu_si512(qs + b * 512 + 64 * c), flip);  // q + 128
    __m512 wd[G];
    for (int g = 0; g < G; ++g) wd[g] = load16(d + (b * G + g) * PW);
    for (int r = 0; r < R; ++r) {
      const int8_t* x = a.row(m0 + r) + b * QB;
      const int32_t* h = a.halves(m0 + r) + b * 2;
      const __m512 s = _mm512_set1_ps(a.s(m0 + r)[b]);
      __m512i sums[G];
      if constexpr (G == 1) {
        sums[0] = _mm512_sub_epi32(dot_chunks<0, 8>(w, x), _mm512_set1_epi32(128 * (h[0] + h[1])));
      } else {
        sums[0] = _mm512_sub_epi32(dot_chunks<0, 4>(w, x), _mm512_set1_epi32(128 * h[0]));
        sums[1] = _mm512_sub_epi32(dot_chunks<4, 8>(w, x), _mm512_set1_epi32(128 * h[1]));
      }
      for (int g = 0; g < G; ++g)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[g]), _mm512_mul_ps(wd[g], s), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], acc[r]);
}

// ------------------------------------------------------------------ AVX2: two halves of 8 rows

AVX2_TARGET inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
AVX2_TARGET inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 int32 sums of 4 products each of unsigned w and signed a
AVX2_TARGET inline __m256i dot4_avx2(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

AVX2_TARGET inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <int R, typename S>
AVX2_TARGET void q4_panel_avx2(const uint8_t* qs, const S* d, const S* mn, int64_t nb,
                               const QuantRows& a, int64_t m0, float (*out)[PW]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<256>(qs + b * 256);
      __m256i w[8];
      for (int c = 0; c < 4; ++c) {
        const __m256i v = load256(qs + b * 256 + 64 * c + 32 * half);
        w[2 * c] = _mm256_and_si256(v, low);
        w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      const __m256 wd = load8(d + b * PW + 8 * half), wm = load8(mn + b * PW + 8 * half);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.row(m0 + r) + b * QB;
        // the block's products summed in int16 before one widening vpmaddwd (instead of one a
        // chunk): a lane's 16 products of q <= 15 and |qa| <= 127 stay within 30480, exact
        __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(word(x)));
        for (int c = 1; c < 8; ++c)
          pairs = _mm256_add_epi16(pairs,
                                   _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(word(x + 4 * c))));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(wd, _mm256_set1_ps(a.s(m0 + r)[b])), acc[r]);
        acc[r] = _mm256_fmadd_ps(wm, _mm256_set1_ps(a.ssum(m0 + r)[b]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * half, acc[r]);
  }
}

template <int R, int G, typename S>
AVX2_TARGET void q8_panel_avx2(const int8_t* qs, const S* d, int64_t nb, const QuantRows& a,
                               int64_t m0, float (*out)[PW]) {
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<512>(qs + b * 512);
      __m256i w[8], w_abs[8];
      for (int c = 0; c < 8; ++c) {
        w[c] = load256(qs + b * 512 + 64 * c + 32 * half);
        w_abs[c] = _mm256_sign_epi8(w[c], w[c]);  // -128 stays 0x80: 128 as unsigned
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.row(m0 + r) + b * QB;
        const __m256 s = _mm256_set1_ps(a.s(m0 + r)[b]);
        for (int g = 0; g < G; ++g) {
          __m256i sum = _mm256_setzero_si256();
          for (int c = g * 8 / G; c < (g + 1) * 8 / G; ++c) {
            const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(word(x + 4 * c)), w[c]);
            sum = _mm256_add_epi32(sum, dot4_avx2(w_abs[c], xs));
          }
          const __m256 wd = load8(d + (b * G + g) * PW + 8 * half);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(wd, s), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out[r] + 8 * half, acc[r]);
  }
}

// ------------------------------------------------------------------ driver

// fn(std::integral_constant<int, R>{}) for the run-time r in 1..MR
template <int R = MR, typename Fn>
inline void with_rows(int64_t r, Fn&& fn) {
  if constexpr (R == 1) {
    fn(std::integral_constant<int, 1>{});
  } else {
    if (r == R) fn(std::integral_constant<int, R>{});
    else with_rows<R - 1>(r, fn);
  }
}

// panel(R, p, m0, out) over every panel and tile of at most `tile` (<= MR) activation rows; writes
// y[M, N] in x's dtype. Threads take whole panels: every weight is read from memory once, for all M
// rows.
template <typename T, typename Panel>
void matmul_into(int64_t M, int64_t N, int64_t tile, T* y, Panel&& panel) {
  const int64_t panels = (N + PW - 1) / PW;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * PW, width = std::min(PW, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += tile) {
        const int64_t rows = std::min<int64_t>(tile, M - m0);
        float out[MR][PW];
        with_rows(rows, [&](auto r) { panel(r, p, m0, out); });
        for (int64_t i = 0; i < rows; ++i) store_outputs(y + (m0 + i) * N + n0, out[i], width);
      }
    }
  });
}

template <typename Panel>
torch::Tensor matmul(const torch::Tensor& x, int64_t N, int64_t tile, Panel&& panel) {
  const int64_t M = x.size(0);
  torch::Tensor y = torch::empty({M, N}, x.scalar_type());
  if (x.scalar_type() == torch::kBFloat16)
    matmul_into(M, N, tile, y.data_ptr<at::BFloat16>(), panel);
  else
    matmul_into(M, N, tile, y.data_ptr<float>(), panel);
  return y;
}

QuantRows quantize_input(const torch::Tensor& x) {
  const int64_t K = x.size(1);
  if (x.scalar_type() == torch::kBFloat16)
    return quantize_rows(x.data_ptr<at::BFloat16>(), x.size(0), K);
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "quantized matmuls take float32 or bfloat16");
  return quantize_rows(x.data_ptr<float>(), x.size(0), K);
}

// calls fn(S{}) with S the scales' element type: float, or at::Half for fp16 scales
template <typename Fn>
auto with_scale_type(const torch::Tensor& d, Fn&& fn) {
  return d.scalar_type() == torch::kFloat16 ? fn(at::Half{}) : fn(float{});
}

// qs [P, K / 32, 256 (q4) | 512 (q8)], d [P, K / 32, 32 / group, 16], mn (q4) like d; N <= 16 P
void check_panels(const torch::Tensor& qs, const torch::Tensor& d, const torch::Tensor& mn,
                  int64_t group, int64_t N, int64_t K) {
  const bool q4 = qs.scalar_type() == torch::kUInt8;
  TORCH_CHECK(q4 || qs.scalar_type() == torch::kInt8, "panels: uint8 (q4) or int8 (q8)");
  TORCH_CHECK(group == QB || (!q4 && group == QB / 2), "a scale per 32 weights, or 16 for q8");
  TORCH_CHECK(K % QB == 0 && qs.dim() == 3 && qs.size(1) == K / QB &&
                  qs.size(2) == (q4 ? 256 : 512) && (N + PW - 1) / PW == qs.size(0),
              "panel shapes");
  TORCH_CHECK(d.numel() == qs.size(0) * (K / group) * PW, "one scale a group and row");
  TORCH_CHECK(d.scalar_type() == torch::kFloat32 || d.scalar_type() == torch::kFloat16,
              "block scales must be float32 or float16");
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous(), "quantized weights must be contiguous");
  if (q4)
    TORCH_CHECK(mn.sizes() == d.sizes() && mn.scalar_type() == d.scalar_type() &&
                    mn.is_contiguous(),
                "q4 offsets: one a block and row, contiguous, in the scales' dtype");
}

torch::Tensor panel_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor mn,
                           int64_t group, int64_t N, int64_t isa) {
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  const int64_t K = x.size(1), nb = K / QB;
  check_panels(qs, d, mn, group, N, K);
  x = x.contiguous();
  const QuantRows a = quantize_input(x);
  const bool vnni = isa == 2;
  return with_scale_type(d, [&](auto scale_type) {
    using S = decltype(scale_type);
    const S* dp = d.data_ptr<S>();
    if (qs.scalar_type() == torch::kUInt8) {
      const uint8_t* w = qs.data_ptr<uint8_t>();
      const S* mp = mn.data_ptr<S>();
      return matmul(x, N, vnni ? MR_VNNI_Q4 : MR_AVX2_Q4, [&](auto r, int64_t p, int64_t m0,
                                                     float (*out)[PW]) {
        constexpr int R = decltype(r)::value;
        const int64_t base = p * nb;
        if (vnni)
          q4_panel_vnni<R>(w + base * 256, dp + base * PW, mp + base * PW, nb, a, m0, out);
        else
          q4_panel_avx2<R>(w + base * 256, dp + base * PW, mp + base * PW, nb, a, m0, out);
      });
    }
    const int8_t* w = qs.data_ptr<int8_t>();
    return matmul(x, N, vnni ? MR_VNNI_Q8 : MR_AVX2_Q8, [&](auto r, int64_t p, int64_t m0,
                                                       float (*out)[PW]) {
      constexpr int R = decltype(r)::value;
      const int64_t base = p * nb;
      if (group == QB) {
        if (vnni) q8_panel_vnni<R, 1>(w + base * 512, dp + base * PW, nb, a, m0, out);
        else q8_panel_avx2<R, 1>(w + base * 512, dp + base * PW, nb, a, m0, out);
      } else {
        if (vnni) q8_panel_vnni<R, 2>(w + base * 512, dp + base * 2 * PW, nb, a, m0, out);
        else q8_panel_avx2<R, 2>(w + base * 512, dp + base * 2 * PW, nb, a, m0, out);
      }
    });
  });
}

// Rows of the weights as a dense matrix of `out`'s dtype: all N for prefill steps (hundreds of
// rows multiply faster through oneDNN's bf16/fp32 matmuls than through int8 dot products), or the
// rows `ids` names (the token embedding, where it is tied to the LM head's panels).
// One block (32 weights) of panel row j as floats, 8 at a time: a row's bytes are 4-byte words
// 64 bytes apart (one per chunk)
template <typename S>
AVX2_TARGET inline void dequantize_block(const uint8_t* block, const S* dp, const S* mp,
                                         int64_t j, int64_t G, bool q4, float* w) {
  auto word = [&](int64_t c) {
    uint32_t v;
    std::memcpy(&v, block + c * 64 + j * 4, sizeof v);
    return static_cast<uint64_t>(v);
  };
  for (int64_t c = 0; c < (q4 ? 4 : 8); c += q4 ? 1 : 2) {
    __m256 v;
    if (q4) {  // weights 8c..8c+3 in the low nibbles, 8c+4..8c+7 in the high ones
      const uint64_t nibbles = (word(c) & 0x0F0F0F0F) | (((word(c) >> 4) & 0x0F0F0F0F) << 32);
      const __m256 level = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(nibbles)));
      v = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(static_cast<float>(dp[j])), level),
                        _mm256_set1_ps(static_cast<float>(mp[j])));
    } else {  // weights 4c..4c+7: chunks c and c + 1
      const uint64_t levels = word(c) | (word(c + 1) << 32);
      const __m256 level = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(levels)));
      const int64_t g = c * 4 * G / QB;
      v = _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(dp[g * PW + j])), level);
    }
    _mm256_storeu_ps(w + (q4 ? 8 * c : 4 * c), v);
  }
}

template <typename T, typename S>
void dequantize_into(const torch::Tensor& qs, const S* dp, const S* mp, int64_t group,
                     const int64_t* ids, torch::Tensor& out) {
  const int64_t K = out.size(1), nb = K / QB, G = QB / group;
  T* o = out.data_ptr<T>();
  const bool q4 = qs.scalar_type() == torch::kUInt8;
  const int64_t block_bytes = q4 ? 256 : 512;
  const uint8_t* bytes = static_cast<const uint8_t*>(qs.data_ptr());
  at::parallel_for(0, out.size(0), 16, [&](int64_t begin, int64_t end) {
    float w[QB];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = ids ? ids[i] : i, p = n / PW, j = n % PW;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t base = p * nb + b;
        dequantize_block(bytes + base * block_bytes, dp + base * G * PW,
                         q4 ? mp + base * PW : nullptr, j, G, q4, w);
        store_outputs(o + i * K + b * QB, w, QB);
      }
    }
  });
}

// ids: int64 row numbers, or empty for every row
torch::Tensor dequantize(torch::Tensor qs, torch::Tensor d, torch::Tensor mn, int64_t group,
                         int64_t N, int64_t K, torch::ScalarType dtype, torch::Tensor ids) {
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16,
              "dequantize to float32 or bfloat16");
  check_panels(qs, d, mn, group, N, K);
  const bool some = ids.numel() > 0;
  if (some) {
    TORCH_CHECK(ids.scalar_type() == torch::kInt64 && ids.dim() == 1, "ids: int64 [n]");
    ids = ids.contiguous();
    const int64_t* first = ids.data_ptr<int64_t>();
    const auto [low, high] = std::minmax_element(first, first + ids.numel());
    TORCH_CHECK(*low >= 0 && *high < N, "ids in 0..N-1");
  }
  torch::Tensor out = torch::empty({some ? ids.size(0) : N, K}, dtype);
  const int64_t* rows = some ? ids.data_ptr<int64_t>() : nullptr;
  with_scale_type(d, [&](auto scale_type) {
    using S = decltype(scale_type);
    const S* mp = qs.scalar_type() == torch::kUInt8 ? mn.data_ptr<S>() : nullptr;
    if (dtype == torch::kBFloat16)
      dequantize_into<at::BFloat16>(qs, d.data_ptr<S>(), mp, group, rows, out);
    else
      dequantize_into<float>(qs, d.data_ptr<S>(), mp, group, rows, out);
    return 0;
  });
  return out;
}

// 2: AVX-512 VNNI, 1: AVX2, 0: neither (the caller stays on PyTorch)
int64_t best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
  return 0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels touch no Python object: other threads (the server's event loop, the grammar
  // worker) run Python while they compute
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("panel_linear", &panel_linear, no_gil, "x @ W.T for weights in 16-row panels (q4 or q8)");
  m.def("dequantize", &dequantize, no_gil, "rows of panel weights (all when ids is empty), dense");
  m.def("best_isa", &best_isa, "2: AVX-512 VNNI, 1: AVX2, 0: neither");
}
