"""The model side of a step (nano-vllm's ModelRunner): the weights as this device and dtype run
them, the attention backend and the paged KV pool, and one flattened forward pass from a scheduled
batch to the logits of the rows that produce tokens (and the logprobs of a prompt's tokens, where
a request scores them). The engine (engine/engine.py) keeps the requests: scheduling, sampling,
detokenizing, accounting."""

from dataclasses import dataclass
from pathlib import Path

import torch

from tokenyard.engine import huge_pages
from tokenyard.engine.attention import AttentionMetadata, SeqSlice, make_attention
from tokenyard.engine.config import EngineConfig
from tokenyard.engine.cpu_decode import CpuDecoder
from tokenyard.engine.cpu_kernels import layer_ops_for
from tokenyard.engine.kv_cache import blocks_for_budget, kv_pool
from tokenyard.engine.loader import load_weights
from tokenyard.engine.lora import Adapters, LoraAdapter
from tokenyard.engine.model import LlamaModel
from tokenyard.engine.outputs import Sampled
from tokenyard.engine.packed_linear import pack_linears, packable
from tokenyard.engine.quantized_linear import (
    QuantizedEmbedding,
    QuantizedLinear,
    dense_copy_pays,
    effective_quantization,
)
from tokenyard.engine.sampler import score_tokens
from tokenyard.engine.scheduler import ScheduledBatch
from tokenyard.engine.sequence import Sequence


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The activations' dtype for `name` on `device` (`auto`: bf16 on CUDA and on CPUs with bf16
    dot products, else fp32)."""
    if name == "auto":
        native_bf16 = device.type == "cuda" or (
            torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        )
        return torch.bfloat16 if native_bf16 else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


# rows of a prompt put through the LM head at once when it is scored: [rows, vocab] fp32 logits
# are 200 kB a row here, so a long prompt's chunk is read in slices
SCORE_ROWS = 256


@dataclass
class PromptRows:
    """A prefill chunk's rows whose next token is a prompt token to score (prompt logprobs)."""

    seq: Sequence
    first: int  # the first of them in the flattened pass
    targets: list[int]  # the prompt tokens they predict, one a row


@dataclass
class StepOutput:
    logits: torch.Tensor | None  # of StepInputs.rows (None: no row produces a token)
    scored: list[list[Sampled]]  # per StepInputs.scoring, its targets with their logprobs


@dataclass
class StepInputs:
    """A scheduled batch flattened into one forward pass."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    producing: list[Sequence]  # the sequences whose last token is computed in this pass
    drafts: list[list[int]]  # theirs, to verify
    rows: list[int]  # the rows of their last token and drafts
    # the LoRA adapters in the pass and their rows (None: all of them)
    lora: list[tuple[LoraAdapter, torch.Tensor | None]]
    scoring: list[PromptRows]


class ModelRunner:
    def __init__(self, config: EngineConfig, path: Path):
        self.device = _device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        quantization = effective_quantization(config.quantization, self.device)
        self.model_config, weights = load_weights(path, quantization)
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        ops = None
        if self.device.type == "cpu" and config.cpu_kernel:
            ops = layer_ops_for(self.model_config.hidden_size, self.model_config.head_dim)
        self.model = LlamaModel(self.model_config, self.max_model_len, ops)
        self.model.load(weights)
        del weights
        self.model.to(self.device, self.dtype).eval()
        if config.packed_weights:
            pack_linears(self.model)
        quantized = [
            m for m in self.model.modules() if isinstance(m, QuantizedLinear | QuantizedEmbedding)
        ]
        dense_copy = dense_copy_pays() if config.dense_copy is None else config.dense_copy
        # the copies are packed bf16 weights: where oneDNN cannot multiply those (AVX2-only
        # CPUs), the kernels serve every step (packable logs why)
        if dense_copy and self.dtype == torch.bfloat16 and packable(torch.bfloat16):
            for layer in quantized:
                if isinstance(layer, QuantizedLinear):
                    layer.keep_dense_copy()
        huge_pages.gather([layer.weight for layer in quantized])
        if config.kv_cache_dtype not in ("auto", "int8"):
            raise ValueError(f"kv_cache_dtype must be auto or int8, not {config.kv_cache_dtype!r}")
        int8_kv = config.kv_cache_dtype == "int8"
        self.attention = make_attention(
            self.device,
            config.block_size,
            self.model_config.head_dim,
            self.dtype,
            config.cpu_kernel,
            int8_kv,
            self.model_config.num_heads // self.model_config.num_kv_heads,
        )
        self.block_size = self.attention.block_size
        self.num_blocks = config.num_blocks or blocks_for_budget(
            self.model_config, self.block_size, self.dtype, config.kv_cache_gib, int8_kv
        )
        self.kv_caches = kv_pool(
            self.model_config, self.num_blocks, self.block_size, self.dtype, self.device, int8_kv
        )
        self.adapters = Adapters(
            self.model_config,
            self.device,
            self.dtype,
            config.max_loras,
            reserved=(config.served_model_name or config.model, config.model),
        )
        self.cpu_decoder = (
            CpuDecoder(self.model, self.attention, self.kv_caches)
            if CpuDecoder.fits(self.model, self.attention)
            else None
        )

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """Each sequence's new tokens (its draft last) side by side, their positions and the
        attention metadata."""
        input_ids: list[int] = []
        positions: list[int] = []
        slices: list[SeqSlice] = []
        producing: list[Sequence] = []
        drafts: list[list[int]] = []
        rows: list[int] = []
        adapted: dict[LoraAdapter, list[int]] = {}
        scoring: list[PromptRows] = []
        for seq, num_new in batch.items:
            first = seq.num_computed
            draft = batch.drafts.get(seq, [])
            if seq.scoring_prompt:
                # position p predicts prompt token p + 1; tokens 1..len(scored) are done (a
                # sequence preempted while scoring recomputes its rows, but scores on)
                start = max(first, len(seq.prompt_logprobs))
                end = min(first + num_new, seq.num_prompt - 1)
                if start < end:
                    targets = seq.token_ids[start + 1 : end + 1]
                    scoring.append(PromptRows(seq, len(input_ids) + start - first, targets))
            if seq.request.adapter is not None:
                adapted.setdefault(seq.request.adapter, []).extend(
                    range(len(input_ids), len(input_ids) + num_new)
                )
            input_ids += seq.token_ids[first : first + num_new - len(draft)] + draft
            positions += range(first, first + num_new)
            slices.append(SeqSlice(seq.table.blocks, first, num_new))
            if first + num_new - len(draft) == seq.num_tokens:
                producing.append(seq)
                drafts.append(draft)
                rows += range(len(input_ids) - 1 - len(draft), len(input_ids))
        return StepInputs(
            torch.tensor(input_ids, device=self.device),
            torch.tensor(positions, device=self.device),
            self.attention.build_metadata(slices, batch.num_decodes),
            producing,
            drafts,
            rows,
            self._lora_groups(adapted, len(input_ids)),
            scoring,
        )

    def _lora_groups(
        self, adapted: dict[LoraAdapter, list[int]], num_rows: int
    ) -> list[tuple[LoraAdapter, torch.Tensor | None]]:
        if len(adapted) == 1 and len(next(iter(adapted.values()))) == num_rows:
            return [(next(iter(adapted)), None)]  # one adapter for the whole step: no gathers
        return [(a, torch.tensor(r, device=self.device)) for a, r in adapted.items()]

    def run(self, step: StepInputs) -> StepOutput:
        """The logits of `step.rows` (None: no row produces a token, a prefill chunk's step) and
        the scores of the prompt tokens `step.scoring` names."""
        hidden = self.forward(step.input_ids, step.positions, step.meta, step.lora)
        logits = self.model.logits(hidden[step.rows]) if step.rows else None
        return StepOutput(logits, [self._score(hidden, part) for part in step.scoring])

    def _score(self, hidden: torch.Tensor, part: PromptRows) -> list[Sampled]:
        top = part.seq.request.params.prompt_logprobs or 0
        scored: list[Sampled] = []
        for at in range(0, len(part.targets), SCORE_ROWS):
            targets = part.targets[at : at + SCORE_ROWS]
            rows = hidden[part.first + at : part.first + at + len(targets)]
            scored += score_tokens(self.model.logits(rows), targets, top)
        return scored

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        lora: list[tuple[LoraAdapter, torch.Tensor | None]] | None = None,
    ) -> torch.Tensor:
        self.model.lora.set(lora or [])
        if self.cpu_decoder is not None and self.cpu_decoder.serves(input_ids.shape[0]):
            return self.cpu_decoder(input_ids, positions, meta)
        return self.model(input_ids, positions, self.kv_caches, self.attention, meta)
