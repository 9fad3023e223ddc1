"""The gateway in front of the real engine server (`tokenyard engine --model smollm2`)."""

import time
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import sqlmodel

from tests.gateway.conftest import day_tokens, reservations, wait_until
from tokenyard.billing.models import UsageRecord


def test_gateway_serves_the_engine(engine: str, start_gateway: Any, team: Any) -> None:
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    _, key = team(kv_pages=3)
    client = gw.client(key)
    messages = [{"role": "user", "content": "Say hello"}]
    # the prompt's cached prefix first, for both requests below: a cold prefill attends in other
    # kernels than the cached prompt's tail does, and a greedy near-tie may break either way
    client.chat.completions.create(model="smollm2", messages=messages, max_tokens=1)
    reply = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8, temperature=0
    )
    assert reply.model == "smollm2"
    assert 0 < reply.usage.completion_tokens <= 8
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content  # greedy: the same answer either way
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens
    # pages come from the engine's block size (16): 3 pages hold 48 tokens, 200 more do not fit
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=200)
    assert err.value.code == "kv_pages"


def test_the_engine_server_keeps_its_converted_tokenizer(engine: str, data_dir: Path) -> None:
    """`tokenyard engine` keeps the GGUF's converted tokenizer under TOKENYARD_DATA_DIR, so the
    next engine started there skips the conversion (tests/engine/test_tokenizer_cache.py)."""
    assert httpx.get(engine + "/health").status_code == 200
    assert list((data_dir / "engine" / "tokenizers").glob("*/tokenizer.json"))


def test_hanging_up_frees_the_engine_at_once(engine: str, start_gateway: Any, team: Any) -> None:
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    _, key = team()
    stream = gw.client(key).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Count from one to one thousand."}],
        max_tokens=500,
        stream=True,
    )
    next(iter(stream))  # the opening chunk: it may come before the engine's step takes it up
    wait_until(lambda: httpx.get(engine + "/load").json()["running"] == 1, 5, "engine start")
    stream.close()
    hung_up = time.monotonic()
    wait_until(lambda: httpx.get(engine + "/load").json()["running"] == 0, 5, "engine cancel")
    load = httpx.get(engine + "/load").json()
    assert load["waiting"] == 0
    assert time.monotonic() - hung_up < 2.0


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_token_counts_are_the_prompt_tokens_the_engine_reads(
    engine: str, start_gateway: Any, team: Any, redis_server: Any
) -> None:
    """Anthropic's count_tokens and OpenAI's input_tokens, each through its own SDK, equal the
    prompt tokens the same request reads (chat template, system prompt and tools included, and a
    stored earlier turn); counting takes one of the team's requests per minute, no tokens, and
    leaves a usage record at no charge."""
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    name, key = team(rpm=7)
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
    turn: dict[str, Any] = {"model": "smollm2", "messages": [{"role": "user", "content": "Oslo?"}]}
    used = 0
    for extra in ({}, {"system": "Answer briefly.", "tools": [WEATHER]}):
        raw = claude.messages.with_raw_response.count_tokens(**turn, **extra)
        assert raw.headers["x-tokenyard-token-count"] == "exact"
        assert raw.headers["x-tokenyard-model"] == "smollm2"
        ran = claude.messages.create(**turn, **extra, max_tokens=1)
        # Anthropic's usage splits the prompt: tokens read from the prefix cache apart
        prompt = ran.usage.input_tokens + (ran.usage.cache_read_input_tokens or 0)
        assert raw.parse().input_tokens == prompt
        used += prompt + ran.usage.output_tokens
    assert raw.parse().input_tokens > 60  # the tool's schema is in the prompt

    client = gw.client(key)
    first = client.responses.create(model="smollm2", input="Name a colour.", max_output_tokens=2)
    follow = {"model": "smollm2", "input": "And another?", "previous_response_id": first.id}
    counted = client.responses.input_tokens.count(**follow)
    assert counted.object == "response.input_tokens"
    second = client.responses.create(**follow, max_output_tokens=1)
    assert counted.input_tokens == second.usage.input_tokens > first.usage.input_tokens
    used += first.usage.total_tokens + second.usage.total_tokens
    # seven requests so far, three of them counts: the eighth in the minute is refused
    with pytest.raises(anthropic.RateLimitError):
        claude.messages.count_tokens(**turn)
    assert day_tokens(redis_server.client(), name) == used

    def usage() -> dict[str, Any]:
        return httpx.get(gw.url + "/v1/usage", headers={"authorization": f"Bearer {key}"}).json()

    wait_until(lambda: usage()["requests"] == 7, 5, "every request recorded")
    counts = usage()["models"]["tokenyard-token-count"]
    assert (counts["requests"], counts["errors"], counts["total_tokens"]) == (3, 0, 0)
    assert counts["cost_usd"] == 0


def test_a_lora_adapter_is_a_model_of_the_catalog(
    engine: str, start_gateway: Any, team: Any, sql: Any
) -> None:
    """An adapter the engine serves (`--lora support=PATH`) named in TOKENYARD_ENGINE_URLS is a
    self-hosted model of its own: the team asks for it by name, the engine runs the adapter, and
    the usage is recorded under it."""
    gw = start_gateway(engine_urls=f"smollm2={engine},support={engine}")
    name, key = team()
    client = gw.client(key)
    assert {"smollm2", "support"} <= {m.id for m in client.models.list().data}
    messages = [{"role": "user", "content": "Name a colour."}]
    # 16 tokens: in fp32 (CPUs without bf16) this adapter's answer parts from the base's at
    # the 8th, in bf16 sooner
    replies = {
        model: client.chat.completions.create(
            model=model, messages=messages, max_tokens=16, temperature=0
        )
        for model in ("smollm2", "support")
    }
    assert replies["support"].model == "support"
    assert replies["support"].choices[0].message.content != (
        replies["smollm2"].choices[0].message.content
    )

    def recorded() -> list[UsageRecord]:
        with sqlmodel.Session(sql) as session:
            query = sqlmodel.select(UsageRecord).where(UsageRecord.team == name)
            return list(session.exec(query))

    wait_until(lambda: len(recorded()) == 2, 10, "the usage records")
    by_model = {r.model: r for r in recorded()}
    assert set(by_model) == {"smollm2", "support"}
    assert by_model["support"].completion_tokens == replies["support"].usage.completion_tokens


def test_a_text_scored_through_the_gateway(
    engine: str, start_gateway: Any, team: Any, redis_server: Any
) -> None:
    """lm-evaluation-harness's way of reading a likelihood (echo, logprobs, max_tokens 0) passes
    the gateway to the engine; the team pays for the prompt it read, and nothing is reserved
    after."""
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    name, key = team()
    client = gw.client(key)
    text = "Paris is the capital of France."
    out = client.completions.create(
        model="smollm2", prompt=text, echo=True, logprobs=1, max_tokens=0
    )
    choice = out.choices[0]
    assert choice.text == text and choice.logprobs.token_logprobs[0] is None
    assert all(lp < 0 for lp in choice.logprobs.token_logprobs[1:])
    assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(
        choice.logprobs.tokens
    )
    assert day_tokens(redis_server.client(), name) == out.usage.prompt_tokens
    held = reservations(redis_server.client(), name)
    assert held["leases"] == 0 and held["pages"] == 0
    with pytest.raises(openai.BadRequestError) as err:  # 0 without echo asks for nothing
        client.completions.create(model="smollm2", prompt=text, max_tokens=0)
    assert err.value.body["param"] == "max_tokens"


def test_an_anthropic_prefill_is_continued_by_the_engine(
    engine: str, start_gateway: Any, team: Any
) -> None:
    """Anthropic's prefill (the request ends with the assistant's first words): the engine goes on
    from them, and the reply holds only what follows, as Anthropic's does."""
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    _, key = team()
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
    started = "The three primary colours are red,"
    turns: list[Any] = [
        {"role": "user", "content": "Name the three primary colours."},
        {"role": "assistant", "content": started},
    ]
    asked = {"model": "smollm2", "messages": turns, "temperature": 0}

    def direct(max_tokens: int) -> dict[str, Any]:
        body = {**asked, "max_tokens": max_tokens, "continue_final_message": True}
        return httpx.post(f"{engine}/v1/chat/completions", json=body, timeout=60).json()

    # the prompt's cached prefix first, for both requests below (a cold prefill attends in other
    # kernels than the cached prompt's tail does, and a greedy near-tie may break either way: here
    # " They are the" warm against " These three colours" cold). The gateway salts the prefix
    # cache with the team, so its request warms its own.
    direct(1)
    claude.messages.create(**asked, max_tokens=1)
    reply = claude.messages.create(**asked, max_tokens=8)
    expected = direct(8)
    assert reply.content[0].text == expected["choices"][0]["message"]["content"]
    assert not reply.content[0].text.startswith(started)


def test_responses_carry_the_tokens_logprobs(engine: str, start_gateway: Any, team: Any) -> None:
    """The Responses API's `top_logprobs` with `include: ["message.output_text.logprobs"]`: each
    output token's logprob and the top k there, whole and streamed (the deltas' add up to the
    whole); without asking, none."""
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    _, key = team()
    client = gw.client(key)
    ask: dict[str, Any] = {
        "model": "smollm2",
        "input": "Name a colour.",
        "max_output_tokens": 6,
        "temperature": 0,
        "store": False,
    }
    asked = {**ask, "top_logprobs": 2, "include": ["message.output_text.logprobs"]}
    whole = client.responses.create(**asked)
    part = whole.output[0].content[0]
    assert len(part.logprobs) == whole.usage.output_tokens
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)
    events = list(client.responses.create(**asked, stream=True))
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [lp.token for lp in deltas] == [lp.token for lp in done.logprobs]
    assert "".join(lp.token for lp in done.logprobs) == done.text
    plain = client.responses.create(**ask)
    assert plain.output[0].content[0].logprobs == []


def test_gemini_clients_get_the_tokens_logprobs(engine: str, start_gateway: Any, team: Any) -> None:
    """google-genai's responseLogprobs / logprobs: each candidate's average and each step's
    chosen token with the top candidates there, whole and with each streamed chunk."""
    from google.genai import types

    gw = start_gateway(engine_urls=f"smollm2={engine}")
    client = gw.gemini(team()[1])
    config = types.GenerateContentConfig(
        max_output_tokens=6, temperature=0, response_logprobs=True, logprobs=2
    )
    reply = client.models.generate_content(model="smollm2", contents="Hi", config=config)
    (cand,) = reply.candidates  # type: ignore[misc]
    chosen = cand.logprobs_result.chosen_candidates  # type: ignore[union-attr]
    assert len(chosen) == reply.usage_metadata.candidates_token_count  # type: ignore[union-attr]
    assert cand.avg_logprobs == pytest.approx(sum(c.log_probability for c in chosen) / len(chosen))
    tops = cand.logprobs_result.top_candidates  # type: ignore[union-attr]
    assert all(len(step.candidates) == 2 for step in tops)
    streamed = client.models.generate_content_stream(model="smollm2", contents="Hi", config=config)
    chunks = [c for c in streamed if c.candidates and c.candidates[0].logprobs_result]
    tokens = [
        t.token
        for c in chunks
        for t in c.candidates[0].logprobs_result.chosen_candidates  # type: ignore[index,union-attr]
    ]
    assert "".join(tokens) == "".join(c.text or "" for c in chunks)
    plain = client.models.generate_content(
        model="smollm2", contents="Hi", config=types.GenerateContentConfig(max_output_tokens=4)
    )
    assert plain.candidates[0].logprobs_result is None  # type: ignore[index]


def test_anthropic_clients_learn_which_stop_sequence_fired(
    engine: str, start_gateway: Any, team: Any
) -> None:
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    _, key = team()
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
    ask: dict[str, Any] = {
        "model": "smollm2",
        "max_tokens": 12,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Count from one to ten."}],
    }
    free = claude.messages.create(**ask)
    assert (free.stop_reason, free.stop_sequence) in (("max_tokens", None), ("end_turn", None))
    word = free.content[0].text.split()[0]  # the first word the model writes: it will stop there
    stopped = claude.messages.create(**ask, stop_sequences=["zzz", word])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    with claude.messages.stream(**ask, stop_sequences=[word]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", word)


def test_teams_do_not_share_cached_prompts(engine: str, start_gateway: Any, team: Any) -> None:
    """A prompt another team sent is not in this team's prefix cache (its usage would say so, and
    its first token would come sooner): each team's requests reach the engine with a salt of their
    team. A client's own cache_salt narrows sharing within its team; the shared scope lets teams
    share."""

    def cached(gw: Any, key: str, text: str, **extra: str) -> int:
        reply = gw.client(key).chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": text}],
            max_tokens=1,
            extra_body=extra or None,
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    def prompt() -> str:
        return f"{uuid.uuid4()} " + "Tell me about the long history of tea in China. " * 8

    a, b = team()[1], team()[1]
    gw = start_gateway(engine_urls=f"smollm2={engine}")
    text = prompt()
    assert cached(gw, a, text) == 0
    assert cached(gw, a, text) > 0
    assert cached(gw, b, text) == 0
    assert cached(gw, a, text, cache_salt="alice") == 0
    assert cached(gw, a, text, cache_salt="alice") > 0
    assert cached(gw, b, text, cache_salt="alice") == 0  # a salt is namespaced by its team
    with pytest.raises(openai.BadRequestError) as err:
        cached(gw, a, text, cache_salt="")
    assert err.value.body["param"] == "cache_salt"

    shared = start_gateway(engine_urls=f"smollm2={engine}", gateway_prefix_cache_scope="shared")
    text = prompt()
    # the system prompt's block may be cached already, from any request without a salt
    first = cached(shared, a, text)
    assert cached(shared, b, text) > first
