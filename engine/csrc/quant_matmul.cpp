// Matmuls on block-quantized weights for CPUs: y[M, N] = x[M, K] @ W[N, K]^T, reading each 4- or
// 8-bit weight once. Decode steps multiply a few rows by every weight of the model, so their time
// is the time to stream the weights from memory: a quarter (q8) or an eighth (q4) of fp32's bytes.
//
// Weights come in blocks along K, each with scales in fp16 where that is exact (GGUF's own fp16
// scales, kept as shipped: a Q4_1 block streams 20 bytes instead of 24) or else fp32; engine/quant.py
// converts every GGUF format to one of these two layouts without rounding anything:
//   q4: 32 weights a block, w = d * q + m with q in 0..15, two a byte (GGML's order: byte j holds
//       weight j in its low nibble and weight j + 16 in its high one)
//   q8: `group` (32, or 16 for Q6_K) weights a scale, w = d * q with q in -128..127
// Activations are quantized per row in blocks of 32 to int8 (a = s * qa, |qa| <= 127), so that the
// dot products run on the CPU's int8 instructions: AVX-512 VNNI's vpdpbusd (u8 x s8, 64 pairs into
// 16 int32 sums) where present, else AVX2's vpmaddubsw (u8 x s8 pairs into int16, exact here: at
// most 2 * 128 * 127 < 32768). Both take one unsigned operand: q4 weights are unsigned already;
// for q8 the weight's sign moves onto the activation (|w| * sign(w) * qa). Each block's int32 sum
// is scaled in fp32 (d * s); q4's offsets, m * (s * sum qa) per block, join the same float sums.
// Work is cut in tiles of up to 4 weight rows x 4 activation rows: on AVX-512 the 16 sums of a tile
// run side by side, each activation block loaded once for the 4 weight rows (a 3072 x 576 Q4_1
// matrix streamed at one row: 114 us with one weight row a pass, 77 us with four).
//
// Both paths are compiled whatever the build machine (function target attributes) and picked at
// run time by the caller (`isa`: 2 = AVX-512 VNNI, 1 = AVX2), so tests can force the AVX2 one.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t QB = 32;  // activation block, and q4's weight block
constexpr int64_t MR = 4;   // activation rows that share one pass over a weight row
constexpr int64_t NR = 4;   // weight rows that share one pass over the activations

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define VNNI_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

// Activations quantized per block of 32: qa (int8), the block's scale s (also repeated for each
// of the 8 int32 sums a block's dot product has on AVX-512, ready to load) and s * sum(qa).
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> scale, lane_scale, sum;
  int64_t blocks;
  const int8_t* row(int64_t m) const { return q.data() + m * blocks * QB; }
  const float* s(int64_t m) const { return scale.data() + m * blocks; }
  const float* lanes(int64_t m) const { return lane_scale.data() + m * blocks * 8; }
  const float* ssum(int64_t m) const { return sum.data() + m * blocks; }
};

template <typename T>
QuantRows quantize_rows(const T* x, int64_t M, int64_t K) {
  const int64_t nb = K / QB;
  QuantRows out{std::vector<int8_t>(M * K), std::vector<float>(M * nb),
                std::vector<float>(M * nb * 8), std::vector<float>(M * nb), nb};
  int8_t* q = out.q.data();
  float* scale = out.scale.data();
  float* lanes = out.lane_scale.data();
  float* sum = out.sum.data();
  at::parallel_for(0, M * nb, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* src = x + i * QB;
      float amax = 0.f;
      for (int64_t j = 0; j < QB; ++j) amax = std::max(amax, std::fabs(static_cast<float>(src[j])));
      const float s = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t total = 0;
      for (int64_t j = 0; j < QB; ++j) {
        const auto v = static_cast<int8_t>(std::nearbyint(static_cast<float>(src[j]) * inv));
        q[i * QB + j] = v;
        total += v;
      }
      scale[i] = s;
      for (int64_t l = 0; l < 8; ++l) lanes[i * 8 + l] = s;
      sum[i] = s * static_cast<float>(total);
    }
  });
  return out;
}

// ------------------------------------------------------------------ AVX2: one block of 32 at a time

AVX2_TARGET inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 8 int32 sums of 4 products each (lane i: weights 4i..4i+3) of unsigned w and signed a
AVX2_TARGET inline __m256i dot4_avx2(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

AVX2_TARGET inline __m256i unpack_q4_avx2(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// the per-lane weight scale of one block of 32: d[0] everywhere, or d[0] then d[1] for groups of 16
template <typename S>
AVX2_TARGET inline __m256 block_scale_avx2(const S* d, int64_t group) {
  const float d0 = static_cast<float>(d[0]);
  return group == QB ? _mm256_set1_ps(d0)
                     : _mm256_set_m128(_mm_set1_ps(static_cast<float>(d[1])), _mm_set1_ps(d0));
}

// AVX2: the tile's weight rows one after another, one block at a time (the same interface as the
// AVX-512 tiles below)
template <int R, int NW, typename S>
AVX2_TARGET void q4_tile_avx2(const uint8_t* const* qs, const S* const* d, const S* const* mn,
                              const QuantRows& a, int64_t m0, int64_t nb, float (*out)[MR]) {
  for (int i = 0; i < NW; ++i) {
    __m256 acc[R];
    float offset[R] = {};
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i w = unpack_q4_avx2(qs[i] + b * QB / 2);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.row(m0 + r) + b * QB));
        const __m256 p = _mm256_cvtepi32_ps(dot4_avx2(w, x));
        const float wd = static_cast<float>(d[i][b]);
        acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(wd * a.s(m0 + r)[b]), acc[r]);
        offset[r] += static_cast<float>(mn[i][b]) * a.ssum(m0 + r)[b];
      }
    }
    for (int r = 0; r < R; ++r) out[i][r] = hsum256(acc[r]) + offset[r];
  }
}

template <int R, int NW, typename S>
AVX2_TARGET void q8_tile_avx2(const int8_t* const* qs, const S* const* d, int64_t group,
                              const QuantRows& a, int64_t m0, int64_t nb, float (*out)[MR]) {
  const int64_t per_block = QB / group;
  for (int i = 0; i < NW; ++i) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs[i] + b * QB));
      const __m256i w_abs = _mm256_sign_epi8(w, w);  // -128 stays 0x80: 128 as unsigned
      const __m256 wd = block_scale_avx2(d[i] + b * per_block, group);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.row(m0 + r) + b * QB));
        const __m256 p = _mm256_cvtepi32_ps(dot4_avx2(w_abs, _mm256_sign_epi8(x, w)));
        acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(wd, _mm256_set1_ps(a.s(m0 + r)[b])), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[i][r] = hsum256(acc[r]);
  }
}

// ------------------------------------------------------------------ AVX-512 VNNI: two blocks a step

// per lane of 16 int32 sums over 64 weights: the scale of the lane's group, from `scales` (one per
// `group` weights); `one`: only the first 32 weights exist (the lanes past them get 0)
// 16 scales from p (lanes past the mask 0), as fp32
VNNI_TARGET inline __m512 load_scales(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
VNNI_TARGET inline __m512 load_scales(const at::Half* p, __mmask16 k) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}

template <typename S>
VNNI_TARGET inline __m512 spread_scales(const S* scales, int64_t group, bool one) {
  const __m512i idx = group == QB ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                                  : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __mmask16 count = group == QB ? (one ? 0x1 : 0x3) : (one ? 0x3 : 0xF);
  return _mm512_permutexvar_ps(idx, load_scales(scales, count));
}

// 64 weights of q4 (two blocks, 32 bytes) as bytes in order: [lo(0..15), hi(0..15), lo(16..31),
// hi(16..31)] holds block 0's weights 0..31 then block 1's; `one`: block 0 only (16 bytes read)
VNNI_TARGET inline __m512i unpack_q4_avx512(const uint8_t* qs, bool one) {
  const __m512i x = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(one ? 0xFFFFu : ~0u, qs));
  const __m512i doubled = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), x);
  const __m512i shifted = _mm512_srlv_epi64(doubled, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F));
}

// R activation rows' int8 blocks and per-lane scales for the step at block b (`one`: block b only)
template <int R, bool one>
VNNI_TARGET inline void load_activations(const QuantRows& a, int64_t m0, int64_t b, __m512i (&x)[R],
                                         __m512 (&s)[R]) {
  for (int r = 0; r < R; ++r) {
    x[r] = _mm512_maskz_loadu_epi8(one ? 0xFFFFFFFFull : ~0ull, a.row(m0 + r) + b * QB);
    s[r] = _mm512_maskz_loadu_ps(one ? 0x00FF : 0xFFFF, a.lanes(m0 + r) + b * 8);
  }
}

// One step of NW weight rows x R activation rows over two blocks (64 weights), or over the last
// block when `one` (K an odd number of blocks: masked loads read nothing past it, and its missing
// partner block multiplies as zeros). The weight rows share each activation load and scale; the
// NW x R sums are independent, so their dependency chains overlap.
template <int R, int NW, bool one, typename S>
VNNI_TARGET inline void q4_step_vnni(const uint8_t* const* qs, const S* const* d,
                                     const QuantRows& a, int64_t m0, int64_t b,
                                     __m512 (&acc)[NW][R]) {
  __m512i x[R];
  __m512 s[R];
  load_activations<R, one>(a, m0, b, x, s);
  for (int i = 0; i < NW; ++i) {
    const __m512i w = unpack_q4_avx512(qs[i] + b * QB / 2, one);
    const __m512 wd = spread_scales(d[i] + b, QB, one);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x[r]));
      acc[i][r] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, s[r]), acc[i][r]);
    }
  }
}

// out[i][r]: weight row i of the tile (its pointers in qs, d, mn) times activation row m0 + r.
// q4's offsets, m * (s * sum qa) per block, join the same sums: 16 blocks per fused multiply-add.
template <int R, int NW, typename S>
VNNI_TARGET void q4_tile_vnni(const uint8_t* const* qs, const S* const* d, const S* const* mn,
                              const QuantRows& a, int64_t m0, int64_t nb, float (*out)[MR]) {
  __m512 acc[NW][R];
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) q4_step_vnni<R, NW, false>(qs, d, a, m0, b, acc);
  if (b < nb) q4_step_vnni<R, NW, true>(qs, d, a, m0, b, acc);
  for (int64_t c = 0; c < nb; c += 16) {
    const __mmask16 k = nb - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (nb - c)) - 1);
    for (int r = 0; r < R; ++r) {
      const __m512 sums = _mm512_maskz_loadu_ps(k, a.ssum(m0 + r) + c);
      for (int i = 0; i < NW; ++i)
        acc[i][r] = _mm512_fmadd_ps(load_scales(mn[i] + c, k), sums, acc[i][r]);
    }
  }
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < R; ++r) out[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

template <int R, int NW, bool one, typename S>
VNNI_TARGET inline void q8_step_vnni(const int8_t* const* qs, const S* const* d, int64_t group,
                                     const QuantRows& a, int64_t m0, int64_t b,
                                     __m512 (&acc)[NW][R]) {
  __m512i x[R];
  __m512 s[R];
  load_activations<R, one>(a, m0, b, x, s);
  const int64_t per_block = QB / group;
  for (int i = 0; i < NW; ++i) {
    const __m512i w = _mm512_maskz_loadu_epi8(one ? 0xFFFFFFFFull : ~0ull, qs[i] + b * QB);
    const __m512i w_abs = _mm512_abs_epi8(w);  // -128 stays 0x80: 128 as unsigned
    const __mmask64 negative = _mm512_movepi8_mask(w);
    const __m512 wd = spread_scales(d[i] + b * per_block, group, one);
    for (int r = 0; r < R; ++r) {
      const __m512i xs = _mm512_mask_sub_epi8(x[r], negative, _mm512_setzero_si512(), x[r]);
      const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w_abs, xs));
      acc[i][r] = _mm512_fmadd_ps(p, _mm512_mul_ps(wd, s[r]), acc[i][r]);
    }
  }
}

template <int R, int NW, typename S>
VNNI_TARGET void q8_tile_vnni(const int8_t* const* qs, const S* const* d, int64_t group,
                              const QuantRows& a, int64_t m0, int64_t nb, float (*out)[MR]) {
  __m512 acc[NW][R];
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) q8_step_vnni<R, NW, false>(qs, d, group, a, m0, b, acc);
  if (b < nb) q8_step_vnni<R, NW, true>(qs, d, group, a, m0, b, acc);
  for (int i = 0; i < NW; ++i)
    for (int r = 0; r < R; ++r) out[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

// ------------------------------------------------------------------ driver

// calls tile<R, NW>(n0, m0, out) over every tile of at most NR weight rows and MR activation rows,
// R and NW compile-time counts, and writes y[M, N] in x's dtype. Each thread takes whole tiles of
// weight rows: every weight is read once, for all M activation rows.
template <int NW, typename T, typename Tile>
inline void tile_rows(int64_t n0, int64_t M, int64_t N, T* y, Tile&& tile) {
  for (int64_t m0 = 0; m0 < M; m0 += MR) {
    float out[NR][MR];
    const int64_t r = std::min(MR, M - m0);
    switch (r) {
      case 4: tile(std::integral_constant<int, 4>{}, std::integral_constant<int, NW>{}, n0, m0, out); break;
      case 3: tile(std::integral_constant<int, 3>{}, std::integral_constant<int, NW>{}, n0, m0, out); break;
      case 2: tile(std::integral_constant<int, 2>{}, std::integral_constant<int, NW>{}, n0, m0, out); break;
      default: tile(std::integral_constant<int, 1>{}, std::integral_constant<int, NW>{}, n0, m0, out); break;
    }
    for (int64_t i = 0; i < NW; ++i)
      for (int64_t j = 0; j < r; ++j) y[(m0 + j) * N + n0 + i] = static_cast<T>(out[i][j]);
  }
}

template <typename T, typename Tile>
void matmul_into(int64_t M, int64_t N, T* y, Tile&& tile) {
  const int64_t tiles = (N + NR - 1) / NR;
  at::parallel_for(0, tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n0 = t * NR;
      if (n0 + NR <= N) {
        tile_rows<NR>(n0, M, N, y, tile);
      } else {  // the last rows of N, one at a time
        for (int64_t n = n0; n < N; ++n) tile_rows<1>(n, M, N, y, tile);
      }
    }
  });
}

template <typename Tile>
torch::Tensor matmul(const torch::Tensor& x, int64_t N, Tile&& tile) {
  const int64_t M = x.size(0);
  torch::Tensor y = torch::empty({M, N}, x.scalar_type());
  if (x.scalar_type() == torch::kBFloat16)
    matmul_into(M, N, y.data_ptr<at::BFloat16>(), tile);
  else
    matmul_into(M, N, y.data_ptr<float>(), tile);
  return y;
}

QuantRows quantize_input(const torch::Tensor& x) {
  const int64_t K = x.size(1);
  if (x.scalar_type() == torch::kBFloat16)
    return quantize_rows(x.data_ptr<at::BFloat16>(), x.size(0), K);
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "quantized matmuls take float32 or bfloat16");
  return quantize_rows(x.data_ptr<float>(), x.size(0), K);
}

void check_input(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % QB == 0, "x must be [M, K] with K a multiple of 32");
}

void check_weights(const torch::Tensor& qs, const torch::Tensor& d) {
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous(), "quantized weights must be contiguous");
  TORCH_CHECK(d.scalar_type() == torch::kFloat32 || d.scalar_type() == torch::kFloat16,
              "block scales must be float32 or float16");
  TORCH_CHECK(d.size(0) == qs.size(0), "one row of scales per weight row");
}

// calls fn(S{}) with S the scales' element type: float, or at::Half for fp16 scales
template <typename Fn>
auto with_scale_type(const torch::Tensor& d, Fn&& fn) {
  return d.scalar_type() == torch::kFloat16 ? fn(at::Half{}) : fn(float{});
}

// the NW row pointers of a tile from n0: a matrix's rows are `stride` elements apart
template <int NW, typename P>
inline std::array<const P*, NW> tile_ptrs(const P* base, int64_t n0, int64_t stride) {
  std::array<const P*, NW> out;
  for (int i = 0; i < NW; ++i) out[i] = base + (n0 + i) * stride;
  return out;
}

torch::Tensor q4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor mn,
                        int64_t isa) {
  check_input(x);
  const int64_t K = x.size(1), nb = K / QB;
  check_weights(qs, d);
  TORCH_CHECK(qs.size(1) * 2 == K && d.size(1) == nb && mn.sizes() == d.sizes(), "q4 shapes");
  TORCH_CHECK(mn.is_contiguous() && mn.scalar_type() == d.scalar_type(),
              "q4 offsets: contiguous, in the scales' dtype");
  x = x.contiguous();
  const QuantRows a = quantize_input(x);
  const uint8_t* w = qs.data_ptr<uint8_t>();
  return with_scale_type(d, [&](auto scale_type) {
    using S = decltype(scale_type);
    const S *dp = d.data_ptr<S>(), *mp = mn.data_ptr<S>();
    return matmul(x, qs.size(0), [&](auto r, auto nw, int64_t n0, int64_t m0, float (*out)[MR]) {
      constexpr int R = decltype(r)::value, NW = decltype(nw)::value;
      const auto wq = tile_ptrs<NW>(w, n0, K / 2);
      const auto wd = tile_ptrs<NW>(dp, n0, nb), wm = tile_ptrs<NW>(mp, n0, nb);
      if (isa == 2)
        q4_tile_vnni<R, NW>(wq.data(), wd.data(), wm.data(), a, m0, nb, out);
      else
        q4_tile_avx2<R, NW>(wq.data(), wd.data(), wm.data(), a, m0, nb, out);
    });
  });
}

torch::Tensor q8_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, int64_t group,
                        int64_t isa) {
  check_input(x);
  const int64_t K = x.size(1), nb = K / QB;
  check_weights(qs, d);
  TORCH_CHECK(group == 32 || group == 16, "q8 scales cover 32 or 16 weights");
  TORCH_CHECK(qs.size(1) == K && d.size(1) == K / group, "q8 shapes");
  x = x.contiguous();
  const QuantRows a = quantize_input(x);
  const int8_t* w = qs.data_ptr<int8_t>();
  return with_scale_type(d, [&](auto scale_type) {
    using S = decltype(scale_type);
    const S* dp = d.data_ptr<S>();
    return matmul(x, qs.size(0), [&](auto r, auto nw, int64_t n0, int64_t m0, float (*out)[MR]) {
      constexpr int R = decltype(r)::value, NW = decltype(nw)::value;
      const auto wq = tile_ptrs<NW>(w, n0, K);
      const auto wd = tile_ptrs<NW>(dp, n0, K / group);
      if (isa == 2)
        q8_tile_vnni<R, NW>(wq.data(), wd.data(), group, a, m0, nb, out);
      else
        q8_tile_avx2<R, NW>(wq.data(), wd.data(), group, a, m0, nb, out);
    });
  });
}

// The weights as a dense [N, K] matrix of `out`'s dtype, written in place: prefill steps (hundreds
// of rows) multiply faster through oneDNN's bf16/fp32 matmuls than through int8 dot products.
template <typename T, typename S>
void dequantize_into(const torch::Tensor& qs, const S* dp, const S* mp, int64_t group,
                     torch::Tensor& out) {
  const int64_t N = out.size(0), K = out.size(1);
  T* o = out.data_ptr<T>();
  const bool q4 = qs.scalar_type() == torch::kUInt8;
  const uint8_t* q4s = q4 ? qs.data_ptr<uint8_t>() : nullptr;
  const int8_t* q8s = q4 ? nullptr : qs.data_ptr<int8_t>();
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      T* row = o + n * K;
      if (q4) {
        const uint8_t* q = q4s + n * K / 2;
        const S *rd = dp + n * (K / QB), *rm = mp + n * (K / QB);
        for (int64_t b = 0; b < K / QB; ++b) {
          const float scale = static_cast<float>(rd[b]), offset = static_cast<float>(rm[b]);
          for (int64_t j = 0; j < QB / 2; ++j) {
            const uint8_t byte = q[b * QB / 2 + j];
            row[b * QB + j] = static_cast<T>(scale * static_cast<float>(byte & 0x0F) + offset);
            row[b * QB + j + QB / 2] = static_cast<T>(scale * static_cast<float>(byte >> 4) + offset);
          }
        }
      } else {
        const int8_t* q = q8s + n * K;
        const S* rd = dp + n * (K / group);
        for (int64_t k = 0; k < K; ++k)
          row[k] = static_cast<T>(static_cast<float>(rd[k / group]) * static_cast<float>(q[k]));
      }
    }
  });
}

torch::Tensor dequantize(torch::Tensor qs, torch::Tensor d, torch::Tensor mn, int64_t group,
                         int64_t K, torch::ScalarType dtype) {
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16,
              "dequantize to float32 or bfloat16");
  torch::Tensor out = torch::empty({qs.size(0), K}, dtype);
  with_scale_type(d, [&](auto scale_type) {
    using S = decltype(scale_type);
    const S* mp = qs.scalar_type() == torch::kUInt8 ? mn.data_ptr<S>() : nullptr;
    if (dtype == torch::kBFloat16)
      dequantize_into<at::BFloat16>(qs, d.data_ptr<S>(), mp, group, out);
    else
      dequantize_into<float>(qs, d.data_ptr<S>(), mp, group, out);
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
  m.def("q4_linear", &q4_linear, "x @ W.T for 4-bit weights (d * q + m, blocks of 32)");
  m.def("q8_linear", &q8_linear, "x @ W.T for 8-bit weights (d * q, a scale per group)");
  m.def("dequantize", &dequantize, "quantized weights as a dense matrix");
  m.def("best_isa", &best_isa, "2: AVX-512 VNNI, 1: AVX2, 0: neither");
}
