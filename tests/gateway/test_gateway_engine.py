"""The gateway in front of the real engine server (`tokenyard engine --model smollm2`)."""

import time
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import wait_until


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
