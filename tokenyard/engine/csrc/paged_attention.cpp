// Decode attention over the paged KV pool, for CPUs: one query token per sequence, keys and values
// read in place through the block table (no gather into a contiguous copy), every sequence and KV
// head of a step in one call. Each cached K/V row is read once for all the query heads that share
// it (GQA); sums are in fp32. Built with -ffast-math (vectorized exp; inputs are always finite).
// The pool is in q's dtype, or int8 with a scale per (slot, KV head): a key's scale multiplies its
// dot products, a value's its probability, so rows are never dequantized in memory.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "attention_parts.h"
#include "int8_pool.h"
#include "vectors.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// Sums of the lanes of L vectors at once (a token's products with q, L tokens): pairs of vectors
// fold into one in log2(L) rounds, each round halving the lanes one vector's partial sums take
// (segments of 2h lanes → h: the lower halves of a's and b's segments, alternating, plus the upper
// halves). Summing each vector on its own took 40% of the kernel; this is ~4x fewer instructions.
// The sums come out in bit-reversed order: token t's products go in at slot bit_reverse(t).
constexpr int64_t LOG2_L = L == 16 ? 4 : 3;
static_assert(L == int64_t{1} << LOG2_L);

constexpr int64_t bit_reverse(int64_t t) {
  int64_t r = 0;
  for (int64_t bit = 0; bit < LOG2_L; ++bit) r |= ((t >> bit) & 1) << (LOG2_L - 1 - bit);
  return r;
}

struct FoldMasks {
  index_vec lower[LOG2_L], upper[LOG2_L];  // per round
  FoldMasks() {
    for (int64_t round = 0, h = L / 2; round < LOG2_L; ++round, h /= 2)
      for (int64_t seg = 0, i = 0; seg < L / (2 * h); ++seg)
        for (int64_t from = 0; from < 2; ++from)  // a's lanes, then b's (index + L)
          for (int64_t k = 0; k < h; ++k, ++i) {
            lower[round][i] = static_cast<int32_t>(from * L + seg * 2 * h + k);
            upper[round][i] = static_cast<int32_t>(from * L + seg * 2 * h + h + k);
          }
  }
};
const FoldMasks FOLD;

// v[bit_reverse(t)] holds token t's partial sums; returns the L totals in token order (v is spent)
inline vec reduce_lanes(vec* v) {
  for (int64_t round = 0, n = L; round < LOG2_L; ++round, n /= 2)
    for (int64_t i = 0; i < n / 2; ++i)
      v[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1], FOLD.lower[round]) +
             __builtin_shuffle(v[2 * i], v[2 * i + 1], FOLD.upper[round]);
  return v[0];
}

// bf16 q over a bf16 pool, on CPUs with bf16 dot products: bf16 pairs summed by vdpbf16ps, as
// the bf16 prefill kernel's exact mode sums them (a speculation's draft rows). Otherwise q is
// widened to fp32 and scaled, each product an fp32 FMA, as the fp32 kernel's exact mode has them
// (attention_parts.h).
template <typename T, typename P>
constexpr bool BF16_DOTS =
#if defined(__AVX512BF16__)
    std::is_same_v<T, at::BFloat16> && std::is_same_v<P, at::BFloat16>;
#else
    false;
#endif

// the body of attention_parts.h's merge_parts (defined after this namespace), per output type
template <typename T>
void merge(const float* tops, const float* totals, const float* sums, int64_t parts,
           int64_t stride, int64_t d, T* out) {
  float top = -std::numeric_limits<float>::max();  // finite: built with -ffast-math
  for (int64_t p = 0; p < parts; ++p)
    if (totals[p * stride] > 0.f) top = std::max(top, tops[p * stride]);
  vec merged[128 / L] = {};
  float total = 0.f;
  for (int64_t p = 0; p < parts; ++p) {
    if (totals[p * stride] <= 0.f) continue;
    const float w = std::exp(tops[p * stride] - top);
    total += w * totals[p * stride];
    const float* part = sums + p * stride * d;
    for (int64_t c = 0; c < d / L; ++c)
      merged[c] =
          fmadd(vec{} + w, *reinterpret_cast<const unaligned_vec*>(part + c * L), merged[c]);
  }
  const float inv = 1.f / total;
  for (int64_t c = 0; c < d / L; ++c)
    for (int64_t l = 0; l < L; ++l) out[c * L + l] = static_cast<T>(merged[c][l] * inv);
}

// T: q's and the output's type; P: the pool's (T, or int8 with k_scales and v_scales)
template <typename T, typename P, int64_t D>
void decode(const T* q, const P* k_cache, const P* v_cache, const float* k_scales,
            const float* v_scales, const int32_t* tables, const int32_t* lens, T* out,
            int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t block_size,
            int64_t max_blocks, float scale) {
  constexpr int64_t C = D / L;
  constexpr bool scaled = std::is_same_v<P, int8_t>;
  constexpr bool dots = BF16_DOTS<T, P>;
  const int64_t group = q_heads / kv_heads;
  const int64_t row = kv_heads * D;  // one token's K (or V): every KV head's, side by side
  // Work items are parts of PART tokens of a sequence: a thread reads each token's K (then V) row
  // for every KV head at once, so a block's cache lines are read in order, each once (an item per
  // (sequence, KV head) read a third of every line pair here and ran at half the speed). Parts
  // let a batch-1 step use every thread; they are merged after, as flash-decoding does: a part
  // keeps its running max, sum of exps and unnormalized sums.
  int64_t longest = 1;
  for (int64_t b = 0; b < batch; ++b) longest = std::max<int64_t>(longest, lens[b]);
  const int64_t parts = (longest + PART - 1) / PART;  // of the longest sequence; others skip theirs
  std::vector<float> tops(batch * parts * q_heads), totals(batch * parts * q_heads, 0.f);
  std::vector<vec> sums(batch * parts * q_heads * C);
  at::parallel_for(0, batch * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [q_heads, the part's tokens]
    std::vector<vec> qv(q_heads * C), partial(q_heads * L, vec{});
#if defined(__AVX512BF16__)
    std::vector<__m512i> qp(dots ? q_heads * D / 32 : 0);  // q's dimension pairs (bf16 dots)
#endif
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / parts, part = i % parts, len = lens[b];
      const int64_t lo = part * PART, hi = std::min(len, lo + PART), n_tokens = hi - lo;
      if (n_tokens <= 0) continue;  // past a shorter sequence's end: its totals stay 0
      const int32_t* table = tables + b * max_blocks;
      // calls fn(j, pool slot of token lo + j) for the part's tokens, walking its blocks of
      // `pool`, and asks for the row PREFETCH_TOKENS ahead of each; past the part's end, for the
      // first rows of the next pass, which reads `next` from token next_lo up to next_hi (parts
      // are short: their first rows would otherwise wait on memory)
      auto each_slot = [&](const P* pool, const P* next, int64_t next_lo, int64_t next_hi,
                           auto fn) {
        const int64_t row_bytes = row * static_cast<int64_t>(sizeof(P));
        int64_t ahead = lo + PREFETCH_TOKENS;
        for (int64_t first = lo; first < hi;) {
          const int64_t offset = first % block_size, n = std::min(block_size - offset, hi - first);
          const int64_t base = table[first / block_size] * block_size + offset;
          for (int64_t t = 0; t < n; ++t, ++ahead) {
            const bool here = ahead < hi;
            const int64_t token = here ? ahead : next_lo + ahead - hi;
            if (token < (here ? hi : next_hi)) {
              const P* from = here ? pool : next;
              const int64_t slot = table[token / block_size] * block_size + token % block_size;
              prefetch_bytes(from + slot * row, row_bytes);
            }
            fn(first - lo + t, base + t);
          }
          first += n;
        }
      };
      scores.resize(q_heads * n_tokens);
      for (int64_t h = 0; h < q_heads; ++h) {
#if defined(__AVX512BF16__)
        if constexpr (dots) {
          for (int64_t c = 0; c < D / 32; ++c)
            qp[h * D / 32 + c] = _mm512_loadu_si512(q + (b * q_heads + h) * D + c * 32);
          continue;
        }
#endif
        load_row<D>(q + (b * q_heads + h) * D, &qv[h * C]);
        for (int64_t c = 0; c < C; ++c) qv[h * C + c] *= scale;
      }
      // each token's products with every query head wait in `partial` until L tokens' are
      // summed at once
      int64_t done = 0, waiting = 0;
      auto flush = [&] {
        for (int64_t h = 0; h < q_heads; ++h) {
          vec chunk = reduce_lanes(&partial[h * L]);
#if defined(__AVX512BF16__)
          if constexpr (dots) chunk = (vec)mul_fixed((__m512)chunk, _mm512_set1_ps(scale));
#endif
          float* dst = scores.data() + h * n_tokens + done;
          if (waiting == L)
            std::memcpy(dst, &chunk, sizeof chunk);
          else
            for (int64_t t = 0; t < waiting; ++t) dst[t] = chunk[t];
        }
        done += waiting;
        waiting = 0;
      };
      each_slot(k_cache, v_cache, lo, hi, [&](int64_t, int64_t slot) {
        const P* keys = k_cache + slot * row;
        for (int64_t kv = 0; kv < kv_heads; ++kv) {
#if defined(__AVX512BF16__)
          if constexpr (dots) {
            __m512i k[D / 32];
            for (int64_t c = 0; c < D / 32; ++c)
              k[c] = _mm512_loadu_si512(keys + kv * D + c * 32);
            for (int64_t h = kv * group; h < (kv + 1) * group; ++h)
              partial[h * L + bit_reverse(waiting)] = (vec)pair_dots<D>(&qp[h * D / 32], k);
            continue;
          }
#endif
          vec k[C];
          load_row<D>(keys + kv * D, k);
          for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
            const vec* qh = &qv[h * C];
            vec s = qh[0] * k[0];
            for (int64_t c = 1; c < C; ++c) s = fmadd(qh[c], k[c], s);
            if constexpr (scaled) s *= k_scales[slot * kv_heads + kv];
            partial[h * L + bit_reverse(waiting)] = s;
          }
        }
        if (++waiting == L) flush();
      });
      if (waiting > 0) flush();
      const int64_t slot = i * q_heads;  // this item's first (item, query head) slot
      for (int64_t h = 0; h < q_heads; ++h) {
        float* s = scores.data() + h * n_tokens;
        // the part's tokens in whole vectors, and the `rest` after them
        const int64_t whole = n_tokens / L * L, rest = n_tokens - whole;
        auto tail = [&](float pad) {  // the last `rest` tokens, padded
          vec x = vec{} + pad;
          std::memcpy(&x, s + whole, rest * sizeof(float));
          return x;
        };
        vec best = rest ? tail(s[0]) : vec{} + s[0];
        for (int64_t j = 0; j < whole; j += L) {
          const vec x = load_vec(s + j);
          best = x > best ? x : best;
        }
        float top = best[0];
        for (int64_t l = 1; l < L; ++l) top = std::max(top, best[l]);
        // exps, and their L sums by position, then attention_parts.h's tree
        const vec top_lanes = vec{} + top;
        vec by_lane{};
        for (int64_t j = 0; j < whole; j += L) {
          const vec e = part_exps(load_vec(s + j), top_lanes);
          store_vec(s + j, e);
          by_lane = add_in_order(by_lane, e);
        }
        if (rest) {
          vec e = part_exps(tail(top), top_lanes);
          for (int64_t l = rest; l < L; ++l) e[l] = 0.f;
          std::memcpy(s + whole, &e, rest * sizeof(float));
          by_lane = add_in_order(by_lane, e);
        }
        const float total = lanes_tree_of(by_lane);
        tops[slot + h] = top;
        totals[slot + h] = total;
      }
      vec* acc = &sums[slot * C];
      for (int64_t c = 0; c < q_heads * C; ++c) acc[c] = vec{};
      // then the next part's keys: this thread most likely takes that part next
      each_slot(v_cache, k_cache, hi, len, [&](int64_t j, int64_t slot) {
        const P* values = v_cache + slot * row;
        for (int64_t kv = 0; kv < kv_heads; ++kv) {
          vec v[C];
          load_row<D>(values + kv * D, v);
          float weight = 1.f;
          if constexpr (scaled) weight = v_scales[slot * kv_heads + kv];
          for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
            const float p = scores[h * n_tokens + j] * weight;
            for (int64_t c = 0; c < C; ++c)
              acc[h * C + c] = fmadd(vec{} + p, v[c], acc[h * C + c]);
          }
        }
      });
    }
  });
  // each (sequence, query head)'s parts merged
  at::parallel_for(0, batch * q_heads, 16, [&](int64_t begin, int64_t end) {
    for (int64_t x = begin; x < end; ++x) {
      const int64_t b = x / q_heads, h = x % q_heads, first = b * parts * q_heads + h;
      merge_parts(&tops[first], &totals[first], reinterpret_cast<const float*>(&sums[first * C]),
                  parts, q_heads, D, out + x * D);
    }
  });
}

// scales: the int8 pool's k_scales and v_scales (undefined tensors for a pool in q's dtype)
template <typename T, typename P, int64_t D>
void run(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const torch::Tensor& k_scales, const torch::Tensor& v_scales, const torch::Tensor& tables,
         const torch::Tensor& lens, torch::Tensor& out, float scale) {
  const float* ks = k_scales.defined() ? k_scales.data_ptr<float>() : nullptr;
  const float* vs = v_scales.defined() ? v_scales.data_ptr<float>() : nullptr;
  decode<T, P, D>(q.data_ptr<T>(), k_cache.data_ptr<P>(), v_cache.data_ptr<P>(), ks, vs,
                  tables.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), out.data_ptr<T>(),
                  q.size(0), q.size(1), k_cache.size(2), k_cache.size(1), tables.size(1), scale);
}

template <typename T, typename P>
void run(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const torch::Tensor& k_scales, const torch::Tensor& v_scales, const torch::Tensor& tables,
         const torch::Tensor& lens, torch::Tensor& out, float scale) {
  if (q.size(2) == 64)
    run<T, P, 64>(q, k_cache, v_cache, k_scales, v_scales, tables, lens, out, scale);
  else
    run<T, P, 128>(q, k_cache, v_cache, k_scales, v_scales, tables, lens, out, scale);
}

template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
         const torch::Tensor& k_scales, const torch::Tensor& v_scales, const torch::Tensor& tables,
         const torch::Tensor& lens, torch::Tensor& out, float scale) {
  if (k_cache.scalar_type() == torch::kInt8)
    run<T, int8_t>(q, k_cache, v_cache, k_scales, v_scales, tables, lens, out, scale);
  else
    run<T, T>(q, k_cache, v_cache, k_scales, v_scales, tables, lens, out, scale);
}

// q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] in q's dtype, or int8 with
// k_scales, v_scales [num_blocks, block_size, Hkv] fp32; block_tables: [B, W] int32;
// context_lens: [B] int32 (each >= 1); D is 64 or 128. Returns [B, Hq, D].
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale,
                           c10::optional<torch::Tensor> k_scales_opt,
                           c10::optional<torch::Tensor> v_scales_opt) {
  TORCH_CHECK(q.dim() == 3 && (q.size(2) == 64 || q.size(2) == 128), "q must be [B, Hq, 64|128]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(3) == q.size(2),
              "the caches must be [num_blocks, block_size, Hkv, head_dim]");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  torch::Tensor k_scales, v_scales;
  if (k_cache.scalar_type() == torch::kInt8) {
    std::tie(k_scales, v_scales) = int8_pool_scales(k_cache, v_cache, k_scales_opt, v_scales_opt);
  } else {
    TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() &&
                    v_cache.scalar_type() == q.scalar_type(),
                "q and the caches must share a dtype (or the caches be int8)");
  }
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 &&
                  context_lens.scalar_type() == torch::kInt32 &&
                  block_tables.size(0) == q.size(0) && context_lens.size(0) == q.size(0),
              "block tables [B, W] and context lengths [B] must be int32");
  q = q.contiguous();
  k_cache = k_cache.contiguous();
  v_cache = v_cache.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  auto out = torch::empty_like(q);
  const auto scale_f = static_cast<float>(scale);
  if (q.scalar_type() == torch::kFloat32)
    run<float>(q, k_cache, v_cache, k_scales, v_scales, block_tables, context_lens, out, scale_f);
  else if (q.scalar_type() == torch::kBFloat16)
    run<at::BFloat16>(q, k_cache, v_cache, k_scales, v_scales, block_tables, context_lens, out,
                      scale_f);
  else
    TORCH_CHECK(false, "paged_decode takes float32 or bfloat16");
  return out;
}

}  // namespace

void merge_parts(const float* tops, const float* totals, const float* sums, int64_t parts,
                 int64_t stride, int64_t d, float* out) {
  merge(tops, totals, sums, parts, stride, d, out);
}

void merge_parts(const float* tops, const float* totals, const float* sums, int64_t parts,
                 int64_t stride, int64_t d, at::BFloat16* out) {
  merge(tops, totals, sums, parts, stride, d, out);
}

// prefill_attention_fp32.cpp; prefill_attention.cpp, built only where the CPU has bf16 dot products
torch::Tensor paged_prefill_fp32(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                 torch::Tensor block_tables, torch::Tensor starts,
                                 torch::Tensor context_lens, double scale, bool exact,
                                 c10::optional<torch::Tensor> k_scales,
                                 c10::optional<torch::Tensor> v_scales);
#if defined(__AVX512BF16__)
torch::Tensor paged_prefill_bf16(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                 torch::Tensor block_tables, torch::Tensor starts,
                                 torch::Tensor context_lens, double scale, bool exact,
                                 c10::optional<torch::Tensor> k_scales,
                                 c10::optional<torch::Tensor> v_scales);
#endif

namespace {

// float32 q through the fp32 kernel, bfloat16 through the bf16 one; `exact`: each row as a lone
// decode computes it (a speculating sequence's rows)
torch::Tensor paged_prefill(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor block_tables, torch::Tensor starts,
                            torch::Tensor context_lens, double scale, bool exact,
                            c10::optional<torch::Tensor> k_scales,
                            c10::optional<torch::Tensor> v_scales) {
  if (q.scalar_type() != torch::kBFloat16)
    return paged_prefill_fp32(q, k_cache, v_cache, block_tables, starts, context_lens, scale,
                              exact, k_scales, v_scales);
#if defined(__AVX512BF16__)
  return paged_prefill_bf16(q, k_cache, v_cache, block_tables, starts, context_lens, scale, exact,
                            k_scales, v_scales);
#else
  TORCH_CHECK(false, "paged_prefill takes bfloat16 only on CPUs with AVX512-BF16");
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels touch no Python object: other threads (the server's event loop, the grammar
  // worker) run Python while they compute
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("paged_decode", &paged_decode, no_gil, "decode attention over a paged KV cache (CPU)",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("k_scales") = py::none(),
        py::arg("v_scales") = py::none());
  m.def("paged_prefill", &paged_prefill, no_gil,
        "causal prefill attention over a paged KV cache (fp32; bf16 where the CPU has bf16 dot "
        "products; exact: each row as a lone decode computes it)",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("starts"), py::arg("context_lens"), py::arg("scale"), py::arg("exact") = false,
        py::arg("k_scales") = py::none(), py::arg("v_scales") = py::none());
  m.attr("EXACT_HEADS") = EXACT_LANES;  // the most query heads per KV head an exact mode takes
#if defined(__AVX512BF16__)
  m.attr("PREFILL_BF16") = true;
#else
  m.attr("PREFILL_BF16") = false;
#endif
}
