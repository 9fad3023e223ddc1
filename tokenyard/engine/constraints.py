"""Constrained decoding: grammars compiled with xgrammar, one matcher per constrained sequence.

A request's `Constraint` (a JSON schema, a structural tag for forced tool calls, or vLLM's regular
expression, EBNF grammar or choice among strings) is compiled once and cached; each of its
sequences gets a matcher that follows the tokens it emits. Before a step's forward pass the token
masks of the rows that produce a token are filled: by a worker thread during the pass (its
kernels release the GIL) where a CPU is left over beside the pass's threads, else on the step's
own thread first. On a CPU the pass keeps busy with all its threads, a third thread only preempts
one of them, and every parallel region then waits for it: at 16 constrained sequences on 2 cores
the worker's 0.5 ms of masks cost 3-5 ms a step (bench/RESULTS.md, issue 21). The sampler then
sets the masked logits of those rows to -inf. Rows of unconstrained sequences are never touched,
and a step without a constrained sequence does no grammar work at all.

Speculative drafts are checked against the mask: the matcher walks the draft token by token,
filling the mask of each row, then rolls back. A draft token the grammar forbids has probability 0
in its row, so the verifier rejects it there, and the rows after it are never sampled.
"""

import json
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import xgrammar as xgr

# JSON schema keywords xgrammar 0.2 accepts but does not enforce (checked one by one against it):
# a schema using one is refused rather than served unchecked
_UNENFORCED = ("not", "if", "then", "else", "contains", "minContains", "maxContains")
# string formats it enforces; any other `format` would pass unchecked
_FORMATS = frozenset(
    "email date time date-time duration uuid ipv4 ipv6 hostname uri uri-reference uri-template "
    "json-pointer relative-json-pointer".split()
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "items", "propertyNames", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped)
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class SchemaError(ValueError):
    """A schema (or structural tag) the grammar library cannot enforce."""


@dataclass(frozen=True)
class Constraint:
    """What the output must match: a JSON schema, an xgrammar structural tag (tool calls), a
    regular expression or an EBNF grammar (xgrammar's dialect, GBNF's); `spec` is its text (JSON
    for the first two; the cache key), `param` the request field it came from."""

    kind: Literal["json_schema", "structural_tag", "regex", "grammar"]
    spec: str
    param: str = field(default="response_format", compare=False)

    @classmethod
    def json_schema(cls, schema: dict, param: str = "response_format") -> "Constraint":
        return cls("json_schema", json.dumps(schema), param)

    @classmethod
    def structural_tag(cls, tag: dict, param: str = "tools") -> "Constraint":
        return cls("structural_tag", json.dumps(tag), param)

    @classmethod
    def choice(cls, options: list[str], param: str) -> "Constraint":
        """Exactly one of the strings (a grammar of their alternatives: JSON's string escapes
        are the grammar's, so any text is a literal)."""
        return cls("grammar", "root ::= " + " | ".join(json.dumps(o) for o in options), param)


def unenforceable(schema: object, where: str = "schema") -> str | None:
    """The first keyword of a JSON schema the library would not enforce, named with its path."""
    if not isinstance(schema, dict):
        return None
    for keyword in _UNENFORCED:
        if keyword in schema:
            return f"'{keyword}' (at {where})"
    fmt = schema.get("format")
    if fmt is not None and fmt not in _FORMATS:
        return f"'format': {fmt!r} (at {where})"
    if len(schema.get("allOf", [])) > 1:
        return f"'allOf' with more than one schema (at {where})"
    if "oneOf" in schema and "discriminator" not in schema:
        # enforced as anyOf: that the output matches only one branch is not checked
        return f"'oneOf' without a discriminator (at {where})"
    children: list[tuple[str, object]] = []
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            children += [(f"{where}.{key}.{k}", v) for k, v in schema[key].items()]
    children += [(f"{where}.{key}", schema[key]) for key in _SCHEMA_ONE if key in schema]
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            children += [(f"{where}.{key}[{i}]", v) for i, v in enumerate(schema[key])]
    for path, child in children:
        found = unenforceable(child, path)
        if found:
            return found
    return None


def _schemas(tag: object) -> list[dict]:
    """The JSON schemas inside a structural tag."""
    if isinstance(tag, list):
        return [s for item in tag for s in _schemas(item)]
    if not isinstance(tag, dict):
        return []
    if tag.get("type") == "json_schema":
        return [tag["json_schema"]]
    return [s for value in tag.values() for s in _schemas(value)]


class Masks:
    """One step's token masks: a bitmask row for every logits row, applied to the constrained
    (the other rows' bits all allow)."""

    def __init__(self, bitmask: torch.Tensor, rows: list[int], unpack: bool):
        self.bitmask, self.rows = bitmask, rows
        # On CPU, xgrammar's kernel tests the bits one by one: 3.2 ms for 16 rows of SmolLM2's
        # 49k vocabulary, 8% of a 16-sequence decode step. Unpacked here, in the worker thread
        # (36 us), the step only does one masked fill (0.23 ms).
        self.forbidden = (
            torch.from_numpy(
                np.unpackbits(~bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
            ).view(torch.bool)
            if unpack
            else None
        )

    def apply(self, logits: torch.Tensor) -> None:
        if self.forbidden is not None:
            logits.masked_fill_(self.forbidden[:, : logits.shape[-1]], -float("inf"))
        else:
            bitmask = self.bitmask.to(logits.device, non_blocking=True)
            xgr.apply_token_bitmask_inplace(logits, bitmask, indices=self.rows)


class Constraints:
    """Compiled grammars (cached) and the matchers of the constrained sequences."""

    def __init__(
        self,
        hf_tokenizer,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        device: torch.device,
    ):
        self.vocab_size = vocab_size
        self._on_cpu = device.type == "cpu"
        info = xgr.TokenizerInfo.from_huggingface(
            hf_tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._compiled: OrderedDict[Constraint, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # the server's loop and the engine's both compile
        self._matchers: dict[int, xgr.GrammarMatcher] = {}
        spare_cpu = device.type != "cpu" or len(os.sched_getaffinity(0)) > torch.get_num_threads()
        self._worker = ThreadPoolExecutor(1, "grammar-masks") if spare_cpu else None

    def compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        """The compiled grammar, from the cache when seen before; SchemaError if unenforceable."""
        with self._lock:
            return self._compile(constraint)

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        compiled = self._compiled.get(constraint)
        if compiled is not None:
            self._compiled.move_to_end(constraint)
            return compiled
        try:
            if constraint.kind in ("json_schema", "structural_tag"):
                spec = json.loads(constraint.spec)
                for schema in _schemas(spec) if constraint.kind == "structural_tag" else [spec]:
                    found = unenforceable(schema)
                    if found:
                        raise SchemaError(f"the schema uses {found}, which cannot be enforced")
            if constraint.kind == "json_schema":
                # compact JSON: a small model offered free whitespace may emit it until max_tokens
                compiled = self._compiler.compile_json_schema(constraint.spec, any_whitespace=False)
            elif constraint.kind == "structural_tag":
                compiled = self._compiler.compile_structural_tag(constraint.spec)
            elif constraint.kind == "regex":
                compiled = self._compiler.compile_regex(constraint.spec)
            else:
                compiled = self._compiler.compile_grammar(constraint.spec)
        except (RuntimeError, ValueError) as exc:  # xgrammar's own refusals
            # its last line, without the time and the C++ source it came from
            raise SchemaError(_XGR_PREFIX.sub("", str(exc).strip().splitlines()[-1])) from None
        if not self._opens(compiled):
            raise SchemaError("it matches no text at all (no token may start the output)")
        self._compiled[constraint] = compiled
        if len(self._compiled) > _CACHE_SIZE:
            self._compiled.popitem(last=False)
        return compiled

    def _opens(self, compiled: xgr.CompiledGrammar) -> bool:
        """Whether some token may start the output. A grammar of no text (`root ::= root`, a
        schema no value meets) compiles, but would forbid every token of its rows."""
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask, 0)
        return bool(bitmask.any())

    # ------------------------------------------------------------ per sequence

    # sequences by their ids: the grammar needs nothing else of them

    def start(self, seq_id: int, constraint: Constraint | None) -> None:
        if constraint is not None:
            self._matchers[seq_id] = xgr.GrammarMatcher(self.compile(constraint))

    def forget(self, seq_id: int) -> None:
        self._matchers.pop(seq_id, None)

    def accept(self, seq_id: int, token: int) -> bool:
        """Advance past an emitted token; True once the grammar is complete (and the output
        must end)."""
        matcher = self._matchers.get(seq_id)
        if matcher is None:
            return False
        matcher.accept_token(token)
        return matcher.is_terminated()

    def masks(self, seq_ids: list[int], drafts: list[list[int]]) -> Future | None:
        """Start filling the masks of the step's rows (the last token and each draft token of
        each producing sequence, in order); None when no sequence is constrained."""
        if not any(seq_id in self._matchers for seq_id in seq_ids):
            return None
        if self._worker is not None:
            return self._worker.submit(self._fill, seq_ids, drafts)
        done: Future = Future()
        done.set_result(self._fill(seq_ids, drafts))
        return done

    def _fill(self, seq_ids: list[int], drafts: list[list[int]]) -> Masks:
        num_rows = sum(1 + len(d) for d in drafts)
        bitmask = xgr.allocate_token_bitmask(num_rows, self.vocab_size)
        rows: list[int] = []
        row = 0
        for seq_id, draft in zip(seq_ids, drafts, strict=True):
            matcher = self._matchers.get(seq_id)
            if matcher is not None:
                walked = 0
                for i in range(len(draft) + 1):
                    matcher.fill_next_token_bitmask(bitmask, row + i)
                    rows.append(row + i)
                    if i == len(draft) or not matcher.accept_token(draft[i]):
                        break
                    walked += 1
                    if matcher.is_terminated():  # a stop token: the rows after it are dropped
                        break
                if walked:
                    matcher.rollback(walked)
            row += 1 + len(draft)
        return Masks(bitmask, rows, unpack=self._on_cpu)
