"""The engine's HTTP server, driven by the official openai SDK and raw HTTP."""

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn

from tokenyard.engine.async_engine import AsyncEngine
from tokenyard.engine.server import create_app

POOL = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving_engine(core) -> Iterator[str]:
    """The engine's HTTP server for `core` on a free loopback port; its URL."""
    engine = AsyncEngine(core)
    engine.start()
    port = free_port()
    config = uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url
    srv.should_exit = True
    thread.join(timeout=10)
    engine.stop()


@pytest.fixture(scope="module")
def server(engine_factory):
    core = engine_factory(num_blocks=POOL, max_num_batched_tokens=256)
    with serving_engine(core) as url:
        yield url, core


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused")


def wait_idle(url: str, core, timeout=15.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        load = httpx.get(f"{url}/load").json()
        if load["running"] == 0 and load["waiting"] == 0 and load["free_blocks"] == POOL:
            core.blocks.check_invariants([])
            return load
        time.sleep(0.05)
    raise AssertionError(f"engine not idle: {load}")


MESSAGES = [{"role": "user", "content": "Name three colours."}]


def test_chat_non_streamed_and_streamed_agree(client, server):
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        extra_headers={"x-request-id": "abc123"},
    )
    assert raw.headers["x-request-id"] == "abc123"
    full = raw.parse()
    assert full.id == "chatcmpl-abc123"
    text = full.choices[0].message.content
    assert text and full.choices[0].finish_reason in ("stop", "length")
    assert full.usage.prompt_tokens > 10
    assert full.usage.completion_tokens <= 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    stream = client.chat.completions.create(
        model="smollm2",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    )
    # the second request found the first one's prompt in the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    wait_idle(*server)


def test_n_choices_logprobs_and_seed(client):
    def sample():
        return client.chat.completions.create(
            model="smollm2", messages=MESSAGES, max_tokens=6, temperature=1.0, seed=7, n=3,
            logprobs=True, top_logprobs=2,
        )  # fmt: skip

    a, b = sample(), sample()
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    entry = a.choices[0].logprobs.content[0]
    assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
    assert entry.top_logprobs[0].logprob >= entry.logprob


def test_a_seed_at_the_top_of_the_range_seeds_every_choice(client):
    """Each choice's stream is seeded with seed + its index: past 2**64 - 1 that overflowed in
    the step, failing every request in it."""

    def sample():
        out = client.completions.create(
            model="smollm2", prompt="Once", max_tokens=4, temperature=1.0, seed=2**64 - 1, n=2
        )
        return [c.text for c in out.choices]

    assert sample() == sample()


def test_completions_with_several_prompts_and_stop(client):
    out = client.completions.create(
        model="smollm2",
        prompt=["The capital of France is", "1, 2, 3, 4,"],
        max_tokens=8,
        temperature=0,
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.text for c in out.choices)
    scored = client.completions.create(
        model="smollm2", prompt=["The capital of France is", "1, 2,"], max_tokens=3, logprobs=1, n=2
    )
    for choice in scored.choices:  # each choice's offsets run from its own start
        assert choice.logprobs.text_offset[0] == 0 and len(choice.logprobs.tokens) >= 1
    stopped = client.completions.create(
        model="smollm2", prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=["7"]
    )
    assert "7" not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"


def test_vllm_extras_are_accepted(client):
    out = client.completions.create(
        model="smollm2",
        prompt="Hello",
        max_tokens=5,
        temperature=0,
        extra_body={
            "top_k": 5,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "min_tokens": 5,
            "ignore_eos": True,
        },
    )
    assert out.usage.completion_tokens == 5


def test_vllms_allowed_tokens_bad_words_and_kept_stop_strings(server, client):
    """allowed_token_ids: every token from the list; bad_words: a word the greedy answer had is
    never generated again, however it would be spelled; include_stop_str_in_output: the stop
    string ends the text instead of being cut; return_tokens_as_token_ids: logprobs name ids."""
    tokenizer = server[1].tokenizer.hf
    ask = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    allowed = tokenizer.encode(" red green blue", add_special_tokens=False)
    extra = {"allowed_token_ids": allowed, "return_tokens_as_token_ids": True}
    only = client.chat.completions.create(**ask, logprobs=True, extra_body=extra)
    named = [t.token for t in only.choices[0].logprobs.content]
    ids = [int(t.removeprefix("token_id:")) for t in named]
    assert len(ids) == 12 and set(ids) <= set(allowed), named

    plain = client.chat.completions.create(**ask).choices[0].message.content
    word = next(w.strip(".,!:;") for w in plain.split() if len(w.strip(".,!:;")) > 3)
    banned = client.chat.completions.create(**ask, extra_body={"bad_words": [word]})
    text = banned.choices[0].message.content
    assert re.search(rf"\b{re.escape(word)}\b", text) is None, (word, plain, text)

    stop = plain.split()[1]
    cut = client.chat.completions.create(**ask, stop=[stop])
    kept = client.chat.completions.create(
        **ask, stop=[stop], extra_body={"include_stop_str_in_output": True}
    )
    assert cut.choices[0].finish_reason == kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].message.content == cut.choices[0].message.content + stop

    scored = client.completions.create(
        model="smollm2",
        prompt="Hello",
        max_tokens=3,
        temperature=0,
        logprobs=2,
        extra_body={"return_tokens_as_token_ids": True},
    )
    tokens = scored.choices[0].logprobs.tokens
    assert all(t.startswith("token_id:") for t in tokens), tokens
    tops = scored.choices[0].logprobs.top_logprobs
    assert all(k.startswith("token_id:") for top in tops for k in top)


def test_vllms_prompt_truncation_and_an_unopened_turn(server, client):
    """truncate_prompt_tokens: only the prompt's last k tokens are read (usage counts k);
    add_generation_prompt false: the template's text ends with the last message; it cannot be
    combined with continue_final_message."""
    url, _ = server
    long = client.completions.create(
        model="smollm2", prompt="one two three four five six seven eight", max_tokens=1
    )
    short = client.completions.create(
        model="smollm2",
        prompt="one two three four five six seven eight",
        max_tokens=1,
        echo=True,
        extra_body={"truncate_prompt_tokens": 3},
    )
    assert long.usage.prompt_tokens > 3 and short.usage.prompt_tokens == 3
    assert short.choices[0].text.startswith(" six seven eight")  # the echo is what was read

    def count(**extra) -> int:
        body = {"model": "smollm2", "messages": MESSAGES, **extra}
        return httpx.post(f"{url}/tokenize", json=body).json()["count"]

    opened = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)
    unopened = client.chat.completions.create(
        model="smollm2",
        messages=MESSAGES,
        max_tokens=1,
        extra_body={"add_generation_prompt": False},
    )
    assert opened.usage.prompt_tokens == count()
    assert unopened.usage.prompt_tokens == count(add_generation_prompt=False) < count()
    both = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": "smollm2",
            "messages": [*MESSAGES, {"role": "assistant", "content": "Red"}],
            "continue_final_message": True,
            "add_generation_prompt": True,
        },
    )
    assert both.status_code == 400 and both.json()["error"]["param"] == "add_generation_prompt"


ONE_TOKEN_AT_LEAST = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 4, "min_tokens": 1}


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "smollm2", "messages": MESSAGES, "max_tokens": "x"}, 400, "max_tokens", None),
        ({"model": "smollm2", "messages": MESSAGES, "temperature": 5}, 400, "temperature", None),
        ({"model": "smollm2", "messages": MESSAGES, "n": 0}, 400, "n", None),
        ({"model": "smollm2", "messages": MESSAGES, "seed": 2**64}, 400, "seed", None),
        # min_tokens holds stop tokens back by indexing the logits with them
        (
            {**ONE_TOKEN_AT_LEAST, "stop_token_ids": [10**9]},
            400,
            "stop_token_ids",
            None,
        ),
        (
            {**ONE_TOKEN_AT_LEAST, "stop_token_ids": [-1]},
            400,
            "stop_token_ids",
            None,
        ),
        ({"model": "smollm2", "messages": MESSAGES, "seed": -(2**63) - 1}, 400, "seed", None),
        ({"model": "smollm2", "messages": []}, 400, "messages", None),
        # malformed turns are refused, not rendered (they were a 500 or a Python repr in the prompt)
        (
            {"model": "smollm2", "messages": [{"role": "someone", "content": "hi"}]},
            400,
            "messages[0].role",
            None,
        ),
        (
            {
                "model": "smollm2",
                "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            },
            400,
            "messages",
            None,
        ),
        (
            {
                "model": "smollm2",
                "messages": [*MESSAGES, {"role": "assistant", "tool_calls": [{"function": 5}]}],
            },
            400,
            "messages[1].tool_calls[0].function",
            None,
        ),
        (
            {
                "model": "smollm2",
                "messages": [
                    *MESSAGES,
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
                    },
                ],
            },
            400,
            "messages[1].tool_calls[0].function.arguments",
            None,
        ),
        ({"messages": MESSAGES}, 400, "model", None),
        ({**ONE_TOKEN_AT_LEAST, "cache_salt": ""}, 400, "cache_salt", None),
        ({**ONE_TOKEN_AT_LEAST, "allowed_token_ids": []}, 400, "allowed_token_ids", None),
        ({**ONE_TOKEN_AT_LEAST, "allowed_token_ids": [10**9]}, 400, "allowed_token_ids", None),
        ({**ONE_TOKEN_AT_LEAST, "bad_words": [" "]}, 400, "bad_words", None),
        ({**ONE_TOKEN_AT_LEAST, "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens", None),
        # a prediction is text, at most MAX_PREDICTION_CHARS of it
        (
            {**ONE_TOKEN_AT_LEAST, "prediction": {"type": "file", "content": "x"}},
            400,
            "prediction.type",
            None,
        ),
        (
            {
                **ONE_TOKEN_AT_LEAST,
                "prediction": {"type": "content", "content": [{"type": "image_url"}]},
            },
            400,
            "prediction",
            None,
        ),
        (
            {**ONE_TOKEN_AT_LEAST, "prediction": {"type": "content", "content": "x" * 200_001}},
            400,
            "prediction",
            None,
        ),
        ({"model": "nope", "messages": MESSAGES}, 404, "model", "model_not_found"),
        (
            {"model": "smollm2", "messages": [{"role": "user", "content": "hi " * 9000}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        (
            {"model": "smollm2", "messages": MESSAGES, "max_tokens": POOL * 16},
            400,
            "max_tokens",
            "kv_cache_capacity_exceeded",
        ),
    ],
)
def test_bad_input_gets_openai_errors(server, body, status, param, code):
    r = httpx.post(f"{server[0]}/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == code and error["message"]
    assert error["type"] == "invalid_request_error"


def test_prompt_token_ids_out_of_the_vocabulary_are_refused_alone(server, client):
    """One such id used to fail the whole step (an index error in the embedding), and with it
    every request in flight."""
    url, core = server
    vocab = core.model_config.vocab_size
    with httpx.Client(base_url=url, timeout=60) as http:
        for ids in ([-1], [5, vocab], [[1, 2], [vocab + 7]]):
            body = {"model": "smollm2", "prompt": ids, "max_tokens": 2}
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "prompt"
            assert f"[0, {vocab})" in r.json()["error"]["message"]
    out = client.completions.create(model="smollm2", prompt=[1, vocab - 1], max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
    wait_idle(url, core)


def test_suffix_is_refused_rather_than_ignored(server, client):
    """`suffix` would give another answer than the one asked for: refused, not ignored, as the
    gateway refuses it for this engine."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, suffix="end.")
    assert err.value.body["param"] == "suffix"
    inert = {"best_of": 1, "suffix": ""}  # asks for nothing: accepted
    out = client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, **inert)
    assert len(out.choices) == 1


def test_best_of_returns_the_likeliest_candidates(server, client):
    url, core = server
    ask = {"model": "smollm2", "prompt": "My favourite fruit is", "max_tokens": 5, "seed": 3}
    every = client.completions.create(**ask, n=6, logprobs=0, temperature=1.2)

    def mean(choice) -> float:
        return sum(choice.logprobs.token_logprobs) / len(choice.logprobs.token_logprobs)

    best = client.completions.create(**ask, n=2, best_of=6, logprobs=0, temperature=1.2)
    # the same six candidates (seeded per choice), the two likeliest returned, likeliest first
    expected = sorted(every.choices, key=mean, reverse=True)[:2]
    assert [c.text for c in best.choices] == [c.text for c in expected]
    assert [c.index for c in best.choices] == [0, 1]
    assert best.usage.completion_tokens == every.usage.completion_tokens  # all six are billed
    bare = client.completions.create(**ask, n=1, best_of=6, temperature=1.2)
    assert bare.choices[0].text == expected[0].text and bare.choices[0].logprobs is None
    for extra in ({"n": 3, "best_of": 2}, {"best_of": 3, "stream": True}):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(**{**ask, **extra})
        assert err.value.body["param"] == "best_of"
    wait_idle(url, core)


ECHOED = "The quick brown fox jumps over the lazy dog, then"


def test_echo_with_max_tokens_0_scores_the_prompt(server, client):
    """How evaluation harnesses (lm-evaluation-harness's local-completions) read a text's
    likelihood: the prompt as token ids, echo, logprobs and nothing generated."""
    url, core = server
    ids = core.tokenizer.encode(ECHOED)
    by_ids = client.completions.create(
        model="smollm2", prompt=ids, echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    (choice,) = by_ids.choices
    assert choice.text == ECHOED and choice.finish_reason == "length"
    assert by_ids.usage.completion_tokens == 0 and by_ids.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(ids)
    assert "".join(lp.tokens) == ECHOED and lp.text_offset[0] == 0
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing before it
    for token, logprob, top in zip(
        lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True
    ):
        assert logprob < 0 and len(top) == 1
        best = max(top.values())
        assert logprob <= best + 1e-6 and (token not in top or top[token] == best)
    # the same text as a string scores the same
    by_text = client.completions.create(
        model="smollm2", prompt=ECHOED, echo=True, logprobs=1, max_tokens=0
    )
    assert by_text.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs)
    wait_idle(url, core)


def test_echo_opens_the_completion_with_its_prompt(server, client):
    url, core = server
    ask = {"model": "smollm2", "prompt": ECHOED, "temperature": 0, "max_tokens": 4}
    plain = client.completions.create(**ask, logprobs=2)
    echoed = client.completions.create(**ask, logprobs=2, echo=True)
    text, plain_text = echoed.choices[0].text, plain.choices[0].text
    assert text == ECHOED + plain_text
    lp, plain_lp = echoed.choices[0].logprobs, plain.choices[0].logprobs
    prompt_len = len(core.tokenizer.encode(ECHOED))
    assert lp.tokens[prompt_len:] == plain_lp.tokens
    assert lp.token_logprobs[prompt_len:] == pytest.approx(plain_lp.token_logprobs)
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    # offsets run on from the prompt into the completion
    assert lp.text_offset[prompt_len] == len(ECHOED)
    assert lp.text_offset == sorted(lp.text_offset)
    # echo without logprobs: the text only; and streamed, the prompt comes first
    bare = client.completions.create(**ask, echo=True)
    assert bare.choices[0].text == text and bare.choices[0].logprobs is None
    chunks = list(client.completions.create(**ask, logprobs=2, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(ECHOED)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert streamed == lp.tokens
    wait_idle(url, core)


def test_vllms_prompt_logprobs_on_chat_and_completions(server):
    """vLLM's extension: each prompt token's logprob, rank and the position's top k, keyed by
    token id; chat's at the top of the response (its prompt is the chat template's), a
    completion's in each choice."""
    url, core = server
    with httpx.Client(base_url=url, timeout=60) as http:
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "smollm2", "messages": MESSAGES, "max_tokens": 1, "prompt_logprobs": 2},
        ).json()
        scores = chat["prompt_logprobs"]
        assert len(scores) == chat["usage"]["prompt_tokens"] and scores[0] is None
        for here in scores[1:]:
            ranks = sorted(e["rank"] for e in here.values())
            assert ranks[:2] == [1, 2] and len(here) in (2, 3)  # the top 2, and the token if not
            best = max(here.values(), key=lambda e: e["logprob"])
            assert best["rank"] == 1 and all(
                isinstance(e["decoded_token"], str) for e in here.values()
            )

        body = {"model": "smollm2", "prompt": ECHOED, "max_tokens": 0, "echo": True}
        both = http.post("/v1/completions", json={**body, "logprobs": 1, "prompt_logprobs": 3})
        choice = both.json()["choices"][0]
        echoed = choice["logprobs"]
        assert all(len(top) == 1 for top in echoed["top_logprobs"][1:])  # as logprobs asks
        ids = core.tokenizer.encode(ECHOED)
        for token_id, here, logprob in zip(
            ids[1:], choice["prompt_logprobs"][1:], echoed["token_logprobs"][1:], strict=True
        ):
            assert 3 <= len(here) <= 4
            assert here[str(token_id)]["logprob"] == pytest.approx(logprob)
        alone = http.post("/v1/completions", json={**body, "prompt_logprobs": 0}).json()
        entries = alone["choices"][0]["prompt_logprobs"][1:]
        assert [list(e) for e in entries] == [[str(t)] for t in ids[1:]]  # the token alone
        assert alone["choices"][0]["logprobs"] is None

        streamed = http.post(
            "/v1/completions", json={**body, "max_tokens": 2, "stream": True, "prompt_logprobs": 1}
        )
        assert (
            streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"
        )
    wait_idle(url, core)


def test_max_tokens_0_only_with_echo(server, client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=0)
    assert err.value.body["param"] == "max_tokens"


def test_malformed_json_and_sdk_errors(server, client):
    r = httpx.post(
        f"{server[0]}/v1/chat/completions",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2", prompt="x", max_tokens=1, temperature=-1)
    assert err.value.body["param"] == "temperature"


def test_disconnect_cancels_and_storm_leaves_every_block_free(server):
    url, core = server

    async def storm():
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def cancelled_stream(i):
                body = {
                    "model": "smollm2",
                    "prompt": f"Story {i}:",
                    "max_tokens": 200,
                    "stream": True,
                    "ignore_eos": True,
                }
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        break  # first event, then the client leaves

            async def cancelled_plain(i):
                body = {
                    "model": "smollm2",
                    "prompt": f"Essay {i}:",
                    "max_tokens": 200,
                    "ignore_eos": True,
                }
                with pytest.raises(httpx.ReadTimeout):
                    await http.post("/v1/completions", json=body, timeout=0.5)

            async def bad(i):
                r = await http.post("/v1/completions", json={"model": "smollm2", "prompt": i})
                assert r.status_code == 400

            async def good(i):
                r = await http.post(
                    "/v1/completions", json={"model": "smollm2", "prompt": "Hi", "max_tokens": 3}
                )
                assert r.status_code == 200

            jobs = [f(i) for i in range(6) for f in (cancelled_stream, cancelled_plain, bad, good)]
            await asyncio.gather(*jobs)

    asyncio.run(storm())
    load = wait_idle(url, core)
    assert load["total_blocks"] == POOL


def test_load_and_metrics(server, client):
    url, _ = server
    client.completions.create(model="smollm2", prompt="Count: 1, 2,", max_tokens=3)
    load = httpx.get(f"{url}/load").json()
    assert set(load) >= {
        "free_blocks",
        "total_blocks",
        "running",
        "waiting",
        "tokens_queued",
        "block_size",
    }
    metrics = httpx.get(f"{url}/metrics").text
    for name in (
        "tokenyard_engine_ttft_seconds_count",
        "tokenyard_engine_itl_seconds_bucket",
        "tokenyard_engine_e2e_seconds_sum",
        "tokenyard_engine_queue_seconds_count",
        "tokenyard_engine_kv_usage_ratio",
        "tokenyard_engine_running",
        "tokenyard_engine_waiting",
        "tokenyard_engine_prefix_cache_hits_tokens_total",
        "tokenyard_engine_preemptions_total",
    ):
        assert name in metrics, name
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def test_tokenize_counts_what_a_request_would_read(server, client):
    """/tokenize of a chat body is the prompt chat would run (template and tools included): its
    count equals the usage's prompt_tokens; a text's tokens are the tokenizer's own, and
    /detokenize turns them back."""
    url, core = server
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    for extra in ({}, {"tools": tools}):
        body = {"model": "smollm2", "messages": MESSAGES, **extra}
        counted = httpx.post(f"{url}/tokenize", json=body).json()
        ran = client.chat.completions.create(**body, max_tokens=1)
        assert counted["count"] == ran.usage.prompt_tokens == len(counted["tokens"])
        assert counted["max_model_len"] == core.max_model_len
    bare = httpx.post(f"{url}/tokenize", json={"model": "smollm2", "messages": MESSAGES}).json()
    assert counted["count"] > bare["count"] + 20  # the tools' description is in the prompt

    text = "Paged attention, 16 tokens a block."
    ids = httpx.post(f"{url}/tokenize", json={"model": "smollm2", "prompt": text}).json()
    assert ids["tokens"] == core.tokenizer.hf.encode(text)
    back = httpx.post(f"{url}/detokenize", json={"model": "smollm2", "tokens": ids["tokens"]})
    assert back.json() == {"prompt": text}

    vocab = core.model_config.vocab_size
    for path, payload, status, param in (
        ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
        (
            "/tokenize",
            {"model": "smollm2", "messages": [{"role": "king"}]},
            400,
            "messages[0].role",
        ),
        ("/tokenize", {"model": "smollm2"}, 400, "prompt"),
        ("/detokenize", {"model": "smollm2", "tokens": [1, vocab]}, 400, "tokens"),
    ):
        r = httpx.post(url + path, json=payload)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param
    wait_idle(url, core)


def test_a_predicted_output_through_the_sdk(server, client):
    """OpenAI's Predicted Outputs (`prediction`): the answer is the one without it, streamed or
    not; usage counts the prediction's tokens accepted and rejected, which add up to its
    length; an answer without a prediction has no such counts."""
    ask = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    plain = client.chat.completions.create(**ask)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None

    def size(said: str) -> int:
        return len(server[1].tokenizer.hf.encode(said, add_special_tokens=False))

    length, unrelated = size(text), "Nothing like the answer."
    for prediction in (text, [{"type": "text", "text": text}], unrelated):
        predicted = {"type": "content", "content": prediction}
        reply = client.chat.completions.create(**ask, prediction=predicted)
        assert reply.choices[0].message.content == text
        details = reply.usage.completion_tokens_details
        counted = details.accepted_prediction_tokens + details.rejected_prediction_tokens
        assert counted == (size(unrelated) if prediction == unrelated else length)
        if prediction != unrelated:
            assert details.accepted_prediction_tokens >= length // 2
    chunks = list(
        client.chat.completions.create(
            **ask,
            prediction={"type": "content", "content": text},
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens >= length // 2
    wait_idle(*server)


def test_an_answer_goes_on_from_the_assistants_last_message(server, client):
    """vLLM's continue_final_message (Anthropic's prefill): the prompt ends inside the assistant's
    message, and the answer is what follows it."""
    url, core = server
    started = "The three primary colours are red,"
    messages = [*MESSAGES, {"role": "assistant", "content": started}]
    reply = client.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=8,
        temperature=0,
        extra_body={"continue_final_message": True},
    )
    ids = core.tokenizer.apply_chat_template(messages, continue_final=True)
    assert core.tokenizer.decode(ids, False).endswith(started)  # no end of turn after it
    assert reply.usage.prompt_tokens == len(ids)
    counted = httpx.post(
        f"{url}/tokenize",
        json={"model": "smollm2", "messages": messages, "continue_final_message": True},
    ).json()
    assert counted["count"] == len(ids)
    # the same prompt as a text completion continues the same way
    same = client.completions.create(model="smollm2", prompt=ids, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == same.choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="smollm2", messages=MESSAGES, extra_body={"continue_final_message": True}
        )
    assert err.value.body["param"] == "continue_final_message"
    wait_idle(url, core)


def test_a_choice_says_which_stop_ended_it(server, client):
    """vLLM's stop_reason: the stop string or stop token id that ended a choice, null for the
    length cap (what the gateway turns into Anthropic's stop_sequence)."""
    url, core = server
    ask = {"model": "smollm2", "prompt": "Count: one, two, three,", "temperature": 0}
    free = client.completions.create(**ask, max_tokens=6)
    assert free.choices[0].finish_reason == "length"
    assert free.choices[0].model_extra["stop_reason"] is None
    word = free.choices[0].text.split(",")[0]  # the first word the model writes
    by_string = client.completions.create(**ask, max_tokens=6, stop=["zzz", word])
    assert by_string.choices[0].finish_reason == "stop"
    assert by_string.choices[0].model_extra["stop_reason"] == word
    forced = core.tokenizer.encode(" banana")[0]  # logit_bias makes it the first token
    by_token = client.chat.completions.create(
        model="smollm2",
        messages=MESSAGES,
        max_tokens=6,
        logit_bias={str(forced): 100},
        extra_body={"stop_token_ids": [forced]},
        stream=True,
    )
    last = [c for c in by_token if c.choices][-1].choices[0]
    assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == forced
    wait_idle(url, core)
