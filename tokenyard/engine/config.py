"""Model and engine settings."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """What the forward pass needs to know about a Llama checkpoint."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # Llama 3 style scaling: {"rope_type": "llama3", "factor", "low_freq_factor", ...}, or None
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()


@dataclass
class EngineConfig:
    """How the engine runs a model: device, cache size and scheduling budget."""

    model: str = "smollm2"
    device: str = "auto"  # auto | cpu | cuda[:N]
    # auto: bf16 on CUDA and on CPUs with bf16 dot products (AVX512-BF16, AMX: matmuls 2-3x faster
    # than fp32); fp32 on other CPUs, where bf16 is emulated and slower
    dtype: str = "auto"
    # tokens per KV block; 0 picks the attention backend's default (16 on CPU, 256 for flash-attn)
    block_size: int = 0
    # CPU: attention and element-wise layer ops compiled (engine/csrc); else PyTorch SDPA and ops
    cpu_kernel: bool = True
    packed_weights: bool = True  # CPU: linear weights packed once for oneDNN (packed_linear.py)
    # CPU matrices: auto keeps a GGUF's quantized ones as shipped (safetensors: float); none
    # dequantizes to `dtype`; int8 / int4 quantize every matrix at load (engine/quant.py). CUDA
    # runs float whatever this says. auto is the fastest at 1, 16 and 64 streams on an AMX CPU
    # (bench/RESULTS.md, issue 17)
    quantization: str = "auto"
    # quantized matrices in a bf16 step: also keep a packed bf16 copy for steps of COPY_ROWS+ rows
    # (batches of decodes, prefill chunks); None: where it outruns the int8 kernels, on CPUs with
    # AMX (engine/quantized_linear.py)
    dense_copy: bool | None = None
    kv_cache_gib: float = 1.0  # memory budget for the KV pool
    # auto: the pool in the model's dtype; int8: a scale per row (kv_cache.Int8Pool), ~1.9x the
    # tokens of a bf16 pool in the same memory (3.8x fp32's); CPU only
    kv_cache_dtype: str = "auto"
    num_blocks: int = 0  # overrides kv_cache_gib when > 0 (tests use small pools)
    max_num_batched_tokens: int = 512  # per-step token budget (decodes + prefill chunks)
    max_num_seqs: int = 64  # sequences running at once
    max_model_len: int = 0  # 0: the model's context length
    enable_prefix_caching: bool = True
    # interactive requests waiting behind running batch work may preempt it, not only on OOM
    preempt_batch_for_interactive: bool = True
    served_model_name: str = ""  # the name clients use; empty: `model`
    # what the engine keeps between starts (a GGUF's converted tokenizer); empty: nothing
    cache_dir: str = ""
    # speculative decoding (engine/speculative.py): draft tokens per sequence and step, 0 = off;
    # no drafts in a step with more decodes than speculative_max_decodes
    speculative_tokens: int = 0
    speculative_max_decodes: int = 4
    # a draft row's cost as a share of a one-row decode step: each sequence drafts as many tokens
    # as its acceptance so far makes pay (engine/speculative.py `draft_length`); 0 always drafts
    # speculative_tokens; None: what was measured on CPU there (speculative.CPU_ROW_COST), 0 on
    # CUDA (a few more rows are nearly free)
    speculative_row_cost: float | None = None
    # draft tokens per step of a request that predicts its output (OpenAI's Predicted Outputs,
    # `prediction`), speculating or not otherwise; 0: predictions are ignored
    prediction_tokens: int = 8
    # LoRA adapters served beside the model (engine/lora.py): the name a request gives as its
    # `model` → a PEFT directory; at most max_loras at once (loaded at start or at run time)
    lora_modules: dict[str, str] = field(default_factory=dict)
    max_loras: int = 8
    # adapters loaded and unloaded over HTTP (/v1/load_lora_adapter): off unless the operator
    # asks, since the request names a path on the engine's disk
    allow_runtime_lora: bool = False
