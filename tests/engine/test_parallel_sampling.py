"""A request's n choices read its prompt once: the others start from the first's cached blocks,
and sample as they would have from a prompt of their own."""

from tests.engine.conftest import assert_all_blocks_free, run_to_completion
from tests.engine.prompts import SYSTEM
from tokenyard.engine.sequence import GenerationRequest, SamplingParams


def sample(engine, prompt: list[int], rid: str, n: int) -> tuple[list[list[int]], list]:
    params = SamplingParams(max_tokens=8, temperature=1.5, seed=11)
    outs = run_to_completion(engine, [GenerationRequest(rid, prompt, params, n=n)])[rid]
    tokens: list[list[int]] = [[] for _ in range(n)]
    for out in outs:
        tokens[out.choice] += out.token_ids
    return tokens, [o for o in outs if o.finish_reason]


def test_choices_share_the_prompt_and_sample_as_alone(engine_factory):
    shared = engine_factory(max_num_batched_tokens=64, num_blocks=128)
    alone = engine_factory(max_num_batched_tokens=64, num_blocks=128, enable_prefix_caching=False)
    prompt = shared.tokenizer.encode(SYSTEM)[:150]
    tokens, ends = sample(shared, prompt, "shared", 3)
    assert [e.stats.cached_tokens for e in sorted(ends, key=lambda e: e.choice)] == [0, 144, 144]
    expected, alone_ends = sample(alone, prompt, "alone", 3)
    assert all(e.stats.cached_tokens == 0 for e in alone_ends)
    assert tokens == expected and len({tuple(t) for t in tokens}) > 1  # seeded per choice
    assert_all_blocks_free(shared)


def test_held_choices_get_the_first_choices_prompt_scores(engine_factory):
    engine = engine_factory(max_num_batched_tokens=64, num_blocks=128)
    prompt = engine.tokenizer.encode(SYSTEM)[40:140]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2)
    request = GenerationRequest("scored", prompt, params, n=2)
    outs = run_to_completion(engine, [request])["scored"]
    firsts = {o.choice: o.prompt_logprobs for o in outs if o.prompt_logprobs is not None}
    assert set(firsts) == {0, 1} and len(firsts[0]) == len(prompt) - 1
    assert firsts[0] == firsts[1]


def test_cancelling_a_request_with_held_choices_frees_everything(engine_factory):
    engine = engine_factory(max_num_batched_tokens=64, num_blocks=128)
    prompt = engine.tokenizer.encode(SYSTEM)[20:170]  # not cached by the tests before
    engine.add_request(GenerationRequest("gone", prompt, SamplingParams(max_tokens=4), n=4))
    engine.step()  # the first choice reads 64 of 150 tokens; three wait for it
    assert len(engine.scheduler.held) == 1
    engine.abort("gone")
    assert not engine.has_work() and not engine.scheduler.held
    assert_all_blocks_free(engine)
