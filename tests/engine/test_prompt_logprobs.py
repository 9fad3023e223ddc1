"""A prompt's tokens scored (OpenAI's echo with logprobs): each token's logprob under the model,
as transformers computes it, whatever the chunking, the prefix cache or a preemption."""

import pytest
import torch

from tests.engine.conftest import assert_all_blocks_free, greedy, run_to_completion
from tests.engine.prompts import TOPICS
from tokenyard.engine.sequence import GenerationRequest

TOP = 3


@pytest.fixture(scope="module")
def prompt(engine_factory) -> list[int]:
    """Three prompts of the comparison set joined: ~60 tokens, several chunks of 16."""
    tokenizer = engine_factory().tokenizer
    return tokenizer.encode(" ".join(TOPICS[:6]))


@pytest.fixture(scope="module")
def expected(reference, prompt) -> torch.Tensor:
    """transformers' log-probabilities at every prompt position [len - 1, vocab]."""
    with torch.inference_mode():
        logits = reference(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def scored(engine, prompt: list[int], rid: str, max_tokens: int = 0, **kw) -> list:
    request = GenerationRequest(rid, prompt, greedy(max_tokens, prompt_logprobs=TOP, **kw))
    outs = run_to_completion(engine, [request])[rid]
    assert outs[0].prompt_logprobs is not None
    assert all(o.prompt_logprobs is None for o in outs[1:])  # reported once, with the first
    return outs


def assert_matches(got, prompt: list[int], expected: torch.Tensor) -> None:
    assert [s.token_id for s in got] == prompt[1:]
    want = expected.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor([s.logprob for s in got]), want, atol=2e-3)
    # the rank: 1 + the tokens likelier there (a token within rounding of it may count either way)
    surely = ((expected > want[:, None] + 1e-4).sum(dim=-1) + 1).tolist()
    maybe = ((expected > want[:, None] - 1e-4).sum(dim=-1) + 1).tolist()
    assert all(lo <= s.rank <= hi for s, lo, hi in zip(got, surely, maybe, strict=True))
    top = expected.topk(TOP, dim=-1)
    for s, ids, values in zip(got, top.indices.tolist(), top.values.tolist(), strict=True):
        assert [t for t, _ in s.top_logprobs] == ids
        assert [lp for _, lp in s.top_logprobs] == pytest.approx(values, abs=2e-3)


def test_a_prompt_read_in_chunks_is_scored_as_transformers_scores_it(
    engine_factory, prompt, expected
):
    engine = engine_factory(max_num_batched_tokens=16, num_blocks=64)
    outs = scored(engine, prompt, "chunks")
    assert len(prompt) > 3 * 16
    assert_matches(outs[0].prompt_logprobs, prompt, expected)
    # max_tokens 0: nothing generated, the request ends when its prompt is read
    assert [o.token_ids for o in outs] == [[]]
    assert outs[0].finish_reason == "length" and outs[0].stats.completion_tokens == 0
    assert_all_blocks_free(engine)


def test_scoring_beside_generation_changes_neither(engine_factory, prompt, expected):
    engine = engine_factory(max_num_batched_tokens=16, num_blocks=64)
    alone = run_to_completion(engine, [GenerationRequest("alone", prompt, greedy(6))])["alone"]
    outs = scored(engine, prompt, "both", max_tokens=6)
    assert_matches(outs[0].prompt_logprobs, prompt, expected)
    assert [t for o in outs for t in o.token_ids] == [t for o in alone for t in o.token_ids]


def test_the_prefix_cache_never_stands_in_for_rows_to_score(engine_factory, prompt, expected):
    engine = engine_factory(max_num_batched_tokens=16, num_blocks=64, enable_prefix_caching=True)
    plain = GenerationRequest("warm", prompt, greedy(1))
    warm = run_to_completion(engine, [plain])["warm"]
    assert warm[-1].stats.cached_tokens == 0
    outs = scored(engine, prompt, "after-cache")
    assert outs[-1].stats.cached_tokens == 0  # read again, not taken from the cache
    assert_matches(outs[0].prompt_logprobs, prompt, expected)
    again = run_to_completion(engine, [GenerationRequest("cached", prompt, greedy(1))])["cached"]
    assert again[-1].stats.cached_tokens > 0  # requests that do not score still use it


def test_a_sequence_preempted_while_scoring_scores_each_token_once(
    engine_factory, prompt, expected
):
    engine = engine_factory(max_num_batched_tokens=16, num_blocks=64)
    request = GenerationRequest("preempted", prompt, greedy(2, prompt_logprobs=TOP))
    engine.add_request(request)
    engine.step()
    engine.step()  # two chunks of 16 read and scored
    (seq,) = engine.scheduler.running
    assert len(seq.prompt_logprobs) == 32
    engine.scheduler.preempt(seq)
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert_matches(outs[0].prompt_logprobs, prompt, expected)
    assert sum(len(o.token_ids) for o in outs) == 2
    assert_all_blocks_free(engine)
