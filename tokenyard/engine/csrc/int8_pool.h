// An int8 KV pool's scales beside its K and V (engine/kv_cache.py Int8Pool): checked once here for
// the decode and prefill kernels, which both read such a pool.
#pragma once

#include <torch/extension.h>

#include <utility>

// k_cache, v_cache: [num_blocks, block_size, Hkv, D]; returns the scales [num_blocks, block_size,
// Hkv] fp32, contiguous
inline std::pair<torch::Tensor, torch::Tensor> int8_pool_scales(
    const torch::Tensor& k_cache, const torch::Tensor& v_cache,
    const c10::optional<torch::Tensor>& k_scales, const c10::optional<torch::Tensor>& v_scales) {
  TORCH_CHECK(v_cache.scalar_type() == torch::kInt8 && k_scales && v_scales,
              "an int8 pool needs int8 K and V and both scales");
  torch::Tensor keys = k_scales->contiguous(), values = v_scales->contiguous();
  TORCH_CHECK(keys.scalar_type() == torch::kFloat32 && values.scalar_type() == torch::kFloat32 &&
                  keys.sizes() == k_cache.sizes().slice(0, 3) && values.sizes() == keys.sizes(),
              "scales must be [num_blocks, block_size, Hkv] float32");
  return {keys, values};
}
