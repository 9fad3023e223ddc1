"""Requests, their sampling parameters, and the sequences the scheduler moves around."""

import enum
import time
from dataclasses import dataclass, field

from tokenyard.engine.constraints import Constraint
from tokenyard.engine.kv_cache import NO_HASH, BlockTable
from tokenyard.engine.lora import LoraAdapter
from tokenyard.engine.outputs import Sampled
from tokenyard.engine.speculative import Acceptance


class Priority(enum.IntEnum):
    """Lower runs first. Batch is preemptible and never runs ahead of interactive."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass
class SamplingParams:
    max_tokens: int = 16  # 0: the prompt is only read (scored, with prompt_logprobs)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # vLLM: -1 (or 0) disables
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: no logprobs; k: the chosen token's and the top k
    # None: the prompt is not scored; k: each prompt token's logprob (after the first, which has
    # nothing before it) and the top k there, from the model's own distribution (OpenAI's echo)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the token's logit
    # vLLM's: only these tokens may be sampled (empty: any); token sequences never generated
    # (the last token of one is banned where the output ends with the ones before it)
    allowed_token_ids: list[int] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)
    include_stop_str_in_output: bool = False  # the stop string that ended the text stays in it
    constraint: Constraint | None = None  # the grammar the output must match (constraints.py)

    @property
    def greedy(self) -> bool:
        # as vLLM: a temperature this small is greedy (dividing logits by it overflows to NaN)
        return self.temperature < 1e-5


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    priority: Priority = Priority.INTERACTIVE
    tenant: str = "default"
    arrival: float = field(default_factory=time.perf_counter)
    speculative: bool = True  # may its decodes verify drafts (when the engine speculates)
    # the output the client expects (OpenAI's Predicted Outputs): drafts come from it first
    prediction: list[int] = field(default_factory=list)
    adapter: LoraAdapter | None = None  # the LoRA adapter it runs with; None: the base model
    # vLLM's cache_salt: only requests of the same salt share prefix-cache blocks (a hit makes
    # the first token come sooner and is counted in the usage, so a shared cache tells one
    # tenant what another sent); None shares with every request without one
    cache_salt: str | None = None


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Timings:
    """Seconds, from the request's arrival."""

    first_scheduled: float | None = None
    prefill_done: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    token_gaps: list[float] = field(default_factory=list)
    compute: float = 0.0  # the sequence's share of the steps it took part in


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request: GenerationRequest
    choice: int
    token_ids: list[int]  # prompt, then generated tokens
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose K/V are in the cache
    num_cached: int = -1  # prompt tokens found in the prefix cache at first admission
    preemptions: int = 0
    table: BlockTable = field(default_factory=BlockTable)
    timings: Timings = field(default_factory=Timings)
    finish_reason: str | None = None
    acceptance: Acceptance = field(default_factory=Acceptance)  # of its speculative drafts
    draft_tokens_kept: int = 0  # draft tokens verification accepted, over its whole life
    prompt_logprobs: list[Sampled] = field(default_factory=list)  # prompt tokens 1.. scored so far

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def scoring_prompt(self) -> bool:
        """Are some of its prompt's tokens still to be scored? Their rows must be computed, so
        the prefix cache cannot stand in for them."""
        wanted = self.request.params.prompt_logprobs is not None
        return wanted and len(self.prompt_logprobs) < self.num_prompt - 1

    @property
    def cache_root(self) -> int:
        """Where its prefix hashes start: K/V computed through an adapter differ from the base
        model's for the same tokens, so each adapter has a prefix cache of its own; a cache salt
        starts a chain of its own within it."""
        adapter, salt = self.request.adapter, self.request.cache_salt
        root = NO_HASH if adapter is None else adapter.cache_root
        return root if salt is None else hash((root, "salt", salt))

    @property
    def priority(self) -> Priority:
        return self.request.priority

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def order(self) -> tuple[int, float, int]:
        """Scheduling order: priority class, then arrival."""
        return (self.request.priority, self.request.arrival, self.seq_id)
