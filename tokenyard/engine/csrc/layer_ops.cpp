// The element-wise parts of a Llama layer as single calls on CPU: residual add + RMSNorm, rotary
// embedding in place (on its own, or with the step's K/V written into the pool), SiLU(gate) * up.
// Unfused, a decode step runs each as 3-9 PyTorch ops whose dispatch costs more than their
// arithmetic (a batch-1 SmolLM2 step: 2.1 ms in RMSNorm, 1.0 ms in rotary, of 16 ms; 1.0 ms in
// split + rotary + the two index_copy_ of K/V, and 1.0 ms in SiLU * up, of 12.5). Each result is
// rounded to the activations' dtype at the same points as the PyTorch expressions in
// engine/model.py, so both paths give the same bits up to the order of the RMSNorm's sum, and for
// SiLU up to the last bit of exp (computed here in vectors: exp_lanes). Every op works in vectors
// of L floats, bf16 rounding included (element by element, converting and rounding each value,
// rotary took 3.9 us a token and 32 us for a 16-row step, against 2.0 and 7.6 now; RMSNorm with
// the residual 17.6 against 6.4 us at 16 rows): the hidden size and half a head must be whole
// vectors (engine/cpu_kernels.py `layer_ops_for` checks a model's shapes).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "vectors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t GRAIN = 16;  // rows per thread at least: a decode step's few rows stay on one

// L (vectors.h): the machine's width. Vectors of 16 floats without AVX-512 (GCC splits them in two)
// ran SiLU * up 3.4x and RMSNorm 2.3x slower on a Zen 3 EPYC (512 fp32 rows: 1,404 against 411
// us, 379 against 165; bench/RESULTS.md)
typedef float vecf __attribute__((vector_size(L * sizeof(float))));
typedef int32_t veci __attribute__((vector_size(L * sizeof(int32_t))));
typedef uint16_t vech __attribute__((vector_size(L * sizeof(uint16_t))));
typedef uint32_t vecu __attribute__((vector_size(L * sizeof(uint32_t))));

inline vecf load(const float* p) {
  vecf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vecf load(const at::BFloat16* p) {  // bf16 is the top half of an fp32
  vech h;
  std::memcpy(&h, p, sizeof h);
  const veci bits = __builtin_convertvector(h, veci) << 16;
  vecf v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
// bf16's bits in the top half of each lane, rounded to nearest even as c10 rounds (finite values)
inline vecu bf16_bits(vecf v) {
  vecu bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
}
inline void store(float* p, vecf v) { std::memcpy(p, &v, sizeof v); }
inline void store(at::BFloat16* p, vecf v) {
  const vech h = __builtin_convertvector(bf16_bits(v) >> 16, vech);
  std::memcpy(p, &h, sizeof h);
}
// v rounded to T and back: what PyTorch does between two ops in T
template <typename T>
inline vecf round_lanes(vecf v) {
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    const vecu bits = bf16_bits(v);
    std::memcpy(&v, &bits, sizeof v);
  }
  return v;
}

// fn(T{}) for the tensor's dtype: float32 or bfloat16, what the engine's activations are
template <typename Fn>
void with_dtype(const torch::Tensor& t, const char* op, Fn&& fn) {
  if (t.scalar_type() == torch::kBFloat16)
    fn(at::BFloat16{});
  else {
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, op, " takes float32 or bfloat16");
    fn(float{});
  }
}

// e^x in every lane: x = n ln2 + r with |r| <= ln2 / 2 (n rounded by the 1.5 * 2^23 trick), e^r
// by its Taylor polynomial to r^6 (relative error under 2e-7, about PyTorch's vectorized exp's),
// 2^n written into the exponent bits. x is clamped to [-87, 88], where 2^n stays a normal float:
// beyond it SiLU's results round to the same values.
inline vecf exp_lanes(vecf x) {
  x = x < -87.f ? vecf{} - 87.f : x;
  x = x > 88.f ? vecf{} + 88.f : x;
  const float shifter = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const vecf shifted = x * 1.44269504f + shifter;
  const vecf n = shifted - shifter;
  const vecf r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 in two parts
  vecf p = vecf{} + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  veci bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // n + 127 in the exponent field
  vecf scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// n is a multiple of L (checked by the caller); in vectors, the sum of squares in L lanes (another
// order than PyTorch's, which the comparison allows for)
template <typename T>
void rms_rows(const T* x, const T* residual, const T* weight, float eps, int64_t rows, int64_t n,
              T* out, T* sum_out) {
  at::parallel_for(0, rows, GRAIN, [&](int64_t begin, int64_t end) {
    std::vector<vecf> h(n / L);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      vecf squares{};
      for (int64_t c = 0; c < n / L; ++c) {
        vecf v = load(xr + c * L);
        if (residual != nullptr) {
          v = round_lanes<T>(v + load(residual + r * n + c * L));
          store(sum_out + r * n + c * L, v);
        }
        h[c] = v;
        squares += v * v;
      }
      float total = 0.f;
      for (int64_t l = 0; l < L; ++l) total += squares[l];
      const float scale = 1.f / std::sqrt(total / static_cast<float>(n) + eps);
      for (int64_t c = 0; c < n / L; ++c)
        store(out + r * n + c * L, load(weight + c * L) * round_lanes<T>(h[c] * scale));
    }
  });
}

void check_rows(const torch::Tensor& t, const torch::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_contiguous() && t.sizes() == like.sizes() && t.dtype() == like.dtype(), name,
              " must be contiguous, of x's shape and dtype");
}

// RMSNorm of x, or of x + residual (also returned: the new residual stream); weight in x's dtype
std::tuple<torch::Tensor, torch::Tensor> rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual,
                                                  torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && x.dim() >= 1, "x must be contiguous");
  const int64_t n = x.size(-1), rows = x.numel() / n;
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n && weight.dtype() == x.dtype(),
              "weight must be [hidden] in x's dtype");
  TORCH_CHECK(n % L == 0, "the hidden size must be a multiple of ", L);
  torch::Tensor out = torch::empty_like(x);
  torch::Tensor sum = residual ? torch::empty_like(x) : torch::Tensor();
  if (residual) check_rows(*residual, x, "residual");
  with_dtype(x, "rms_norm", [&](auto type) {
    using T = decltype(type);
    rms_rows<T>(x.data_ptr<T>(), residual ? residual->data_ptr<T>() : nullptr, weight.data_ptr<T>(),
                static_cast<float>(eps), rows, n, out.data_ptr<T>(),
                residual ? sum.data_ptr<T>() : nullptr);
  });
  return {out, sum};
}

// q [T, Hq, D] and k [T, Hk, D] rotated in place by cos, sin [T, D] (HF's rotate-half convention):
// x * cos + rotate_half(x) * sin, each product rounded to T as PyTorch rounds it. Token rows may be
// `stride` apart (views of the fused QKV projection's output). d / 2 is a multiple of L (checked
// by the callers).
template <typename T>
void rotate_rows(T* x, int64_t tokens, int64_t heads, int64_t d, int64_t stride, const T* cos,
                 const T* sin) {
  const int64_t half = d / 2;
  at::parallel_for(0, tokens, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + t * d;
      const T* s = sin + t * d;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + t * stride + h * d;
        for (int64_t i = 0; i < half; i += L) {
          const vecf a = load(v + i), b = load(v + i + half);
          store(v + i, round_lanes<T>(a * load(c + i)) + round_lanes<T>(-b * load(s + i)));
          store(v + i + half,
                round_lanes<T>(b * load(c + i + half)) + round_lanes<T>(a * load(s + i + half)));
        }
      }
    }
  });
}

void rotary_(torch::Tensor q, torch::Tensor k, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "q and k must be [T, heads, D]");
  const int64_t tokens = q.size(0), d = q.size(2);
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == d && k.stride(2) == 1 && k.stride(1) == d,
              "q and k: each token's heads must be contiguous");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == tokens * d &&
                  sin.numel() == tokens * d && cos.dtype() == q.dtype() && sin.dtype() == q.dtype(),
              "cos and sin must be [T, D] in q's dtype");
  TORCH_CHECK(d % (2 * L) == 0, "the head size must be a multiple of ", 2 * L);
  with_dtype(q, "rotary", [&](auto type) {
    using T = decltype(type);
    rotate_rows<T>(q.data_ptr<T>(), tokens, q.size(1), d, q.stride(0), cos.data_ptr<T>(),
                   sin.data_ptr<T>());
    rotate_rows<T>(k.data_ptr<T>(), tokens, k.size(1), d, k.stride(0), cos.data_ptr<T>(),
                   sin.data_ptr<T>());
  });
}

// a K or V row of d values into an int8 pool row and its scale, as kv_cache.quantize_rows rounds
// (the same fp32 operations in the same order, so both give the same bits)
template <typename T>
void quantize_row(const T* src, int64_t d, int8_t* dst, float* scale) {
  float top = 0.f;
  for (int64_t i = 0; i < d; ++i) top = std::max(top, std::fabs(static_cast<float>(src[i])));
  const float s = top * (1.f / 127.f);
  const float inverse = s > 0.f ? 1.f / s : 0.f;
  for (int64_t i = 0; i < d; ++i) {
    const float v = std::nearbyint(static_cast<float>(src[i]) * inverse);
    dst[i] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
  }
  *scale = s;
}

// the fused projection's output [T, (Hq + 2 Hk) D] → rotated q (a [T, Hq, D] view of it); its
// rotated K and V rows are written into the pool views k_slots, v_slots [slots, Hk, D] at
// slots [T] (int64): a decode step's split, rotary and two index_copy_ in one call. An int8 pool
// (k_slots and v_slots int8) takes its rows quantized, their scales into k_scales, v_scales
// [slots, Hk] fp32.
torch::Tensor rotary_to_cache_(torch::Tensor qkv, int64_t q_heads, int64_t kv_heads,
                               torch::Tensor cos, torch::Tensor sin, torch::Tensor k_slots,
                               torch::Tensor v_slots, torch::Tensor slots,
                               c10::optional<torch::Tensor> k_scales,
                               c10::optional<torch::Tensor> v_scales) {
  TORCH_CHECK(k_slots.dim() == 3 && k_slots.is_contiguous() && v_slots.is_contiguous() &&
                  k_slots.sizes() == v_slots.sizes() && k_slots.size(1) == kv_heads,
              "k_slots and v_slots must be contiguous [slots, kv_heads, D]");
  const bool int8 = k_slots.scalar_type() == torch::kInt8;
  const int64_t d = k_slots.size(2), tokens = qkv.size(0), width = qkv.size(1);
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && width == (q_heads + 2 * kv_heads) * d,
              "qkv must be contiguous [T, (q_heads + 2 kv_heads) * D]");
  TORCH_CHECK(d % (2 * L) == 0, "the head size must be a multiple of ", 2 * L);
  if (int8) {
    TORCH_CHECK(v_slots.scalar_type() == torch::kInt8 && k_scales && v_scales &&
                    k_scales->scalar_type() == torch::kFloat32 &&
                    v_scales->scalar_type() == torch::kFloat32 && k_scales->is_contiguous() &&
                    v_scales->is_contiguous() && k_scales->sizes() == k_slots.sizes().slice(0, 2) &&
                    v_scales->sizes() == k_scales->sizes(),
                "an int8 pool needs int8 K and V and contiguous fp32 scales [slots, kv_heads]");
  } else {
    TORCH_CHECK(k_slots.dtype() == qkv.dtype() && v_slots.dtype() == qkv.dtype(),
                "the pool must be in qkv's dtype (or int8)");
  }
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == tokens && slots.scalar_type() == torch::kInt64,
              "slots must be [T] int64");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == tokens * d &&
                  sin.numel() == tokens * d && cos.dtype() == qkv.dtype() && sin.dtype() == qkv.dtype(),
              "cos and sin must be [T, D] in qkv's dtype");
  slots = slots.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= 0 && slot[t] < k_slots.size(0), "slot ", slot[t], " outside the pool");
  with_dtype(qkv, "rotary_to_cache", [&](auto type) {
    using T = decltype(type);
    T* x = qkv.data_ptr<T>();
    const T *c = cos.data_ptr<T>(), *s = sin.data_ptr<T>();
    rotate_rows<T>(x, tokens, q_heads, d, width, c, s);
    rotate_rows<T>(x + q_heads * d, tokens, kv_heads, d, width, c, s);
    const int64_t kv_row = kv_heads * d;
    for (int64_t t = 0; t < tokens; ++t) {
      const T* row = x + t * width + q_heads * d;
      if (!int8) {
        std::memcpy(k_slots.data_ptr<T>() + slot[t] * kv_row, row, kv_row * sizeof(T));
        std::memcpy(v_slots.data_ptr<T>() + slot[t] * kv_row, row + kv_row, kv_row * sizeof(T));
        continue;
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t at = slot[t] * kv_heads + h;
        quantize_row(row + h * d, d, k_slots.data_ptr<int8_t>() + at * d,
                     k_scales->data_ptr<float>() + at);
        quantize_row(row + kv_row + h * d, d, v_slots.data_ptr<int8_t>() + at * d,
                     v_scales->data_ptr<float>() + at);
      }
    }
  });
  return qkv.narrow(1, 0, q_heads * d).view({tokens, q_heads, d});
}

// gate_up [T, 2I] (gate then up) -> SiLU(gate) * up [T, I], rounded as F.silu(gate) * up: SiLU's
// result to T, then the product
template <typename T>
void silu_rows(const T* in, T* out, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T *gate = in + r * 2 * n, *up = gate + n;
      T* o = out + r * n;
      auto lanes = [&](const T* g_src, const T* u_src, T* dst) {
        const vecf g = load(g_src);
        const vecf silu = round_lanes<T>(g / (1.f + exp_lanes(vecf{} - g)));
        store(dst, silu * load(u_src));
      };
      int64_t i = 0;
      for (; i + L <= n; i += L) lanes(gate + i, up + i, o + i);
      if (i < n) {  // the last lanes, through zero-padded copies
        T g[L] = {}, u[L] = {}, y[L];
        std::memcpy(g, gate + i, (n - i) * sizeof(T));
        std::memcpy(u, up + i, (n - i) * sizeof(T));
        lanes(g, u, y);
        std::memcpy(o + i, y, (n - i) * sizeof(T));
      }
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "gate_up must be contiguous [T, 2I]");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  torch::Tensor out = torch::empty({rows, n}, gate_up.options());
  with_dtype(gate_up, "silu_mul", [&](auto type) {
    using T = decltype(type);
    silu_rows(gate_up.data_ptr<T>(), out.data_ptr<T>(), rows, n);
  });
  return out;
}

// One part of a LoRA adapter on a fused projection's output: y[row, offset : offset + n] += (x[row]
// · aᵀ) · b for each row (all, or those listed), a [rank, in] and b [rank, n] (the scale folded in).
// In PyTorch that is four ops per part (two thin matmuls, a slice, an add), each with a fixed cost
// well above its arithmetic at a decode's one row (bf16 matmuls ~19 us each): a rank-16 adapter on
// every projection made a batch-1 step take 2x as long (bench/lora.py). The products are summed
// in fp32 and y rounded once, as y.add_ of an fp32 delta rounds.
// R rows at once (their indices in `row`): each vector of a and b read once for all of them
template <int64_t R, typename T>
void lora_block(const T* x, T* y, const T* a, const T* b, const int64_t* row, int64_t in,
                int64_t rank, int64_t n, int64_t y_stride, int64_t offset, float* t) {
  for (int64_t j = 0; j < rank; ++j) {
    const T* aj = a + j * in;
    vecf acc[R] = {};
    for (int64_t k = 0; k < in; k += L) {
      const vecf av = load(aj + k);
      for (int64_t r = 0; r < R; ++r) acc[r] += load(x + row[r] * in + k) * av;
    }
    for (int64_t r = 0; r < R; ++r) {
      float sum = 0.f;
      for (int64_t l = 0; l < L; ++l) sum += acc[r][l];
      t[r * rank + j] = sum;
    }
  }
  for (int64_t o = 0; o < n; o += L) {
    vecf delta[R] = {};
    for (int64_t j = 0; j < rank; ++j) {
      const vecf bv = load(b + j * n + o);
      for (int64_t r = 0; r < R; ++r) delta[r] += t[r * rank + j] * bv;
    }
    for (int64_t r = 0; r < R; ++r) {
      T* yr = y + row[r] * y_stride + offset + o;
      store(yr, load(yr) + delta[r]);
    }
  }
}

template <typename T>
void lora_rows(const T* x, T* y, const T* a, const T* b, const int64_t* rows, int64_t count,
               int64_t in, int64_t rank, int64_t n, int64_t y_stride, int64_t offset) {
  constexpr int64_t R = 4;
  // blocks of R rows, one thread's share at least; a row's sums are the same in a block or alone
  at::parallel_for(0, (count + R - 1) / R, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> t(R * rank);
    for (int64_t blk = begin; blk < end; ++blk) {
      int64_t row[R];
      const int64_t first = blk * R, full = std::min(R, count - first);
      for (int64_t r = 0; r < full; ++r) row[r] = rows != nullptr ? rows[first + r] : first + r;
      if (full == R) {
        lora_block<R>(x, y, a, b, row, in, rank, n, y_stride, offset, t.data());
      } else {  // the last few rows one by one: a decode's single row reads nothing twice
        for (int64_t r = 0; r < full; ++r)
          lora_block<1>(x, y, a, b, row + r, in, rank, n, y_stride, offset, t.data());
      }
    }
  });
}

void lora_add_(torch::Tensor y, torch::Tensor x, torch::Tensor a, torch::Tensor b,
               c10::optional<torch::Tensor> rows, int64_t offset) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && a.is_contiguous() && b.is_contiguous(),
              "lora_add_: x, a and b must be contiguous matrices");
  TORCH_CHECK(y.dim() == 2 && y.stride(1) == 1, "lora_add_: y must be rows of contiguous values");
  TORCH_CHECK(y.scalar_type() == x.scalar_type() && a.scalar_type() == x.scalar_type() &&
                  b.scalar_type() == x.scalar_type(),
              "lora_add_: y, x, a and b must share a dtype");
  const int64_t in = x.size(1), rank = a.size(0), n = b.size(1);
  TORCH_CHECK(a.size(1) == in && b.size(0) == rank && offset >= 0 && offset + n <= y.size(1) &&
                  y.size(0) == x.size(0),
              "lora_add_: shapes do not match");
  TORCH_CHECK(in % L == 0 && n % L == 0, "lora_add_: in and out sizes must be multiples of ", L);
  const int64_t* row_ids = nullptr;
  int64_t count = x.size(0);
  if (rows.has_value()) {
    TORCH_CHECK(rows->scalar_type() == torch::kInt64 && rows->is_contiguous(),
                "lora_add_: rows must be int64");
    row_ids = rows->data_ptr<int64_t>();
    count = rows->numel();
    for (int64_t i = 0; i < count; ++i)
      TORCH_CHECK(row_ids[i] >= 0 && row_ids[i] < x.size(0), "lora_add_: row ", row_ids[i],
                  " is out of range");
  }
  with_dtype(x, "lora_add_", [&](auto type) {
    using T = decltype(type);
    lora_rows(x.data_ptr<T>(), y.data_ptr<T>(), a.data_ptr<T>(), b.data_ptr<T>(), row_ids, count,
              in, rank, n, y.stride(0), offset);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the kernels touch no Python object: other threads (the server's event loop, the grammar
  // worker) run Python while they compute
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("rms_norm", &rms_norm, no_gil, "RMSNorm of x (or of x + residual, also returned)");
  m.def("rotary_", &rotary_, no_gil, "rotary embedding of q and k, in place");
  m.def("rotary_to_cache_", &rotary_to_cache_, no_gil,
        "rotary in place on a fused QKV output, its K and V written into the pool; returns q",
        py::arg("qkv"), py::arg("q_heads"), py::arg("kv_heads"), py::arg("cos"), py::arg("sin"),
        py::arg("k_slots"), py::arg("v_slots"), py::arg("slots"), py::arg("k_scales") = py::none(),
        py::arg("v_scales") = py::none());
  m.def("silu_mul", &silu_mul, no_gil, "SiLU(gate) * up from the fused gate_up projection");
  m.def("lora_add_", &lora_add_, no_gil,
        "y[rows, offset:offset+n] += (x[rows] a^T) b, one part of a LoRA adapter, in place");
  m.attr("LANES") = L;  // the hidden size, and twice the head size, must be multiples of it
}
