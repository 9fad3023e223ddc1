"""Constrained decoding in the engine: outputs match their schema under greedy and sampled
decoding, other sequences of the batch are untouched, and speculation, preemption and chunked
prefill keep both true."""

import json
import os
import threading

import jsonschema
import pytest
import torch
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.conftest import assert_all_blocks_free, greedy, run_to_completion
from tests.engine.test_speculative import PLAIN, SPECULATIVE, counters
from tokenyard.engine.constraints import Constraint, Constraints, Masks, unenforceable
from tokenyard.engine.outputs import RequestError
from tokenyard.engine.sequence import GenerationRequest, Priority, SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Rotterdam", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def chat(engine, text: str) -> list[int]:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def text_of(outputs: list) -> str:
    return "".join(o.text for o in outputs)


def tokens(outputs: list) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


# ---------------------------------------------------------------- bounded schemas

LEAVES = st.sampled_from(
    [
        {"type": "string", "maxLength": 12},
        {"type": "integer", "minimum": -5, "maximum": 500},
        {"type": "boolean"},
        {"type": "null"},
        {"enum": ["red", "green", "blue"]},
    ]
)


def _object(props: dict) -> st.SearchStrategy:
    required = st.lists(st.sampled_from(sorted(props)), unique=True)
    return required.map(
        lambda req: {
            "type": "object",
            "properties": props,
            "required": req,
            "additionalProperties": False,
        }
    )


def _compound(children: st.SearchStrategy) -> st.SearchStrategy:
    objects = st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3)
    arrays = st.tuples(children, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}
    )
    any_of = st.lists(children, min_size=2, max_size=2).map(lambda s: {"anyOf": s})
    return st.one_of(objects.flatmap(_object), arrays, any_of)


# the top is an object (the JSON an API asks for); up to 5 leaves below it
SCHEMAS = st.recursive(LEAVES, _compound, max_leaves=5).map(
    lambda s: {"type": "object", "properties": {"value": s}, "required": ["value"]}
)


@settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=SCHEMAS)
def test_outputs_validate_under_generated_schemas(engine_factory, schema):
    engine = engine_factory(**PLAIN)
    prompt = chat(engine, f"Reply with JSON matching this schema: {json.dumps(schema)}")
    constraint = Constraint.json_schema(schema)
    requests = [
        GenerationRequest(
            f"t{t}",
            prompt,
            SamplingParams(max_tokens=200, temperature=t, seed=7, constraint=constraint),
        )
        for t in (0.0, 1.0)
    ]
    outputs = run_to_completion(engine, requests)
    for request in requests:
        out = outputs[request.request_id]
        assert out[-1].finish_reason == "stop", (schema, text_of(out))
        jsonschema.validate(json.loads(text_of(out)), schema)


# ---------------------------------------------------------------- the batch


def test_unconstrained_sequence_is_untouched_by_constrained_neighbours(engine_factory):
    engine = engine_factory(**PLAIN)
    free = GenerationRequest("free", chat(engine, "Name three colours."), greedy(16))
    alone = run_to_completion(engine, [free])["free"]
    constrained = [
        GenerationRequest(
            f"c{i}",
            chat(engine, "Describe a person as JSON."),
            SamplingParams(
                max_tokens=48, temperature=t, seed=i, constraint=Constraint.json_schema(PERSON)
            ),
        )
        for i, t in enumerate((0.0, 1.0, 0.7))
    ]
    together = run_to_completion(engine, [*constrained, free])
    assert tokens(together["free"]) == tokens(alone)
    for request in constrained:
        jsonschema.validate(json.loads(text_of(together[request.request_id])), PERSON)


RECORD = '{"name": "Ada Lovelace", "age": 36, "city": "Paris"}'


def test_speculation_checks_drafts_against_the_grammar(engine_factory):
    """Drafts copied from the prompt are verified under the mask: greedy output is the same as
    without speculation, with shared prompt prefixes, chunked prefill and batch priority."""
    plain, engine = engine_factory(**PLAIN), engine_factory(**SPECULATIVE)
    prompt = chat(engine, f"Return this record exactly, as JSON: {RECORD} {RECORD} {RECORD}")
    other = chat(engine, f"Copy: {RECORD} and also {RECORD}, then {RECORD}")
    requests = [
        GenerationRequest(
            f"s{i}",
            prompt if i % 2 else other,
            greedy(36, constraint=Constraint.json_schema(PERSON) if i % 3 else None),
            priority=Priority.BATCH if i % 2 else Priority.INTERACTIVE,
        )
        for i in range(8)
    ]
    proposed, accepted = counters(engine)
    hits = engine.blocks.prefix_hits
    expected = run_to_completion(plain, requests)
    got = run_to_completion(engine, requests)
    for request in requests:
        assert tokens(got[request.request_id]) == tokens(expected[request.request_id])
        if request.params.constraint is not None:
            jsonschema.validate(json.loads(text_of(got[request.request_id])), PERSON)
    proposed_now, accepted_now = counters(engine)
    assert accepted_now > accepted and proposed_now > proposed
    assert engine.blocks.prefix_hits > hits
    assert_all_blocks_free(engine)


# ---------------------------------------------------------------- refusals and bias


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
        ({"type": "string", "format": "iri"}, "'format': 'iri'"),
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "'allOf'"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf'"),
        ({"type": "array", "contains": {"const": 1}}, "'contains'"),
        ({"if": {"type": "integer"}, "then": {"minimum": 1}}, "'if'"),
    ],
)
def test_unenforceable_schema_features_are_refused_by_name(engine_factory, schema, named):
    assert named in unenforceable(schema)
    engine = engine_factory(**PLAIN)
    request = GenerationRequest(
        "bad", [1, 2, 3], SamplingParams(constraint=Constraint.json_schema(schema))
    )
    with pytest.raises(RequestError) as caught:
        engine.add_request(request)
    assert named in caught.value.message and caught.value.param == "response_format"
    assert not engine.has_work()


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint("grammar", "root ::= root", "guided_grammar"),
        Constraint.json_schema({"enum": []}, "guided_json"),
    ],
)
def test_a_grammar_of_no_text_is_refused(engine_factory, constraint):
    """It compiles, but no token could start the output: refused up front, rather than a step
    whose every token is forbidden."""
    engine = engine_factory(**PLAIN)
    request = GenerationRequest("empty", [1, 2, 3], SamplingParams(constraint=constraint))
    with pytest.raises(RequestError) as caught:
        engine.add_request(request)
    assert caught.value.param == constraint.param and caught.value.code == "invalid_schema"
    assert not engine.has_work()


def test_enforced_features_pass_the_check():
    schema = {
        "type": "object",
        "properties": {
            "a": {"allOf": [{"$ref": "#/$defs/n"}]},
            "b": {"type": "string", "format": "date", "pattern": "^2"},
            "c": {"oneOf": [{"const": "x"}, {"const": "y"}], "discriminator": {}},
        },
        "$defs": {"n": {"type": "integer", "multipleOf": 3}},
    }
    assert unenforceable(schema) is None


def test_cpu_masks_forbid_exactly_what_xgrammars_kernel_does():
    vocab = 1000  # not a multiple of 32: the bitmask's last word has bits past the vocabulary
    bitmask = xgr.allocate_token_bitmask(3, vocab)  # every bit set: every token allowed
    bitmask[[0, 2]] = torch.randint(-(2**31), 2**31 - 1, (2, bitmask.shape[1]), dtype=torch.int32)
    logits = torch.randn(3, vocab)
    ours, theirs = logits.clone(), logits.clone()
    Masks(bitmask, [0, 2], unpack=True).apply(ours)
    Masks(bitmask, [0, 2], unpack=False).apply(theirs)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[1], logits[1])  # the unconstrained row
    assert 0 < int(ours[[0, 2]].isinf().sum()) < 2 * vocab


def test_masks_fill_beside_the_forward_pass_only_with_a_cpu_to_spare(engine_factory, monkeypatch):
    """With every CPU running the forward pass's threads the masks are filled on the step's own
    thread (a worker would preempt one of them); with a CPU left over, on the worker. Both fill
    the same masks."""
    tokenizer = engine_factory(**PLAIN).tokenizer
    cpus = len(os.sched_getaffinity(0))
    fills, masks = [], {}
    fill = Constraints._fill

    def spy(self, seqs, drafts):
        fills.append(threading.current_thread() is threading.main_thread())
        return fill(self, seqs, drafts)

    monkeypatch.setattr(Constraints, "_fill", spy)
    constraint = Constraint.json_schema(PERSON)
    for threads in (cpus, cpus - 1):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        constraints = Constraints(
            tokenizer.hf, len(tokenizer.hf), tokenizer.eos_token_ids, torch.device("cpu")
        )
        for seq_id in range(3):
            constraints.start(seq_id, constraint)
        constraints.accept(1, tokenizer.encode("{")[0])  # one sequence a token further
        masks[threads] = constraints.masks([0, 1, 2], [[], [], []]).result()
    assert fills == [True, False]  # the step's thread with no CPU to spare, then the worker
    assert torch.equal(masks[cpus].forbidden, masks[cpus - 1].forbidden)
    assert not torch.equal(masks[cpus].forbidden[0], masks[cpus].forbidden[1])


def test_logit_bias_moves_the_greedy_choice(engine_factory):
    engine = engine_factory(**PLAIN)
    prompt = chat(engine, "Name three colours.")
    first = tokens(run_to_completion(engine, [GenerationRequest("a", prompt, greedy(1))])["a"])[0]
    banned = GenerationRequest("b", prompt, greedy(4, logit_bias={first: -100.0}))
    forced = GenerationRequest("c", prompt, greedy(4, logit_bias={42: 100.0}))
    out = run_to_completion(engine, [banned, forced])
    assert first not in tokens(out["b"])
    assert tokens(out["c"]) == [42] * 4
    with pytest.raises(RequestError) as caught:
        engine.add_request(GenerationRequest("d", prompt, greedy(1, logit_bias={10**6: 1.0})))
    assert caught.value.param == "logit_bias"
