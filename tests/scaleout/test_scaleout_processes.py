"""The platform as several processes on one machine: two gateways and two CPU engine replicas of
SmolLM2 sharing one Redis and one SQL database, reached only through their ports.

Load spreads across the engines; a team's quota holds across both gateways; a gateway drained with
SIGTERM finishes its streams; killing one engine mid-load ends its streams with an error event,
moves new requests to the other replica, and the broken streams are still billed.
"""

import json
import os
import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from tests.gateway.conftest import (
    TOKENYARD,
    Gateway,
    Process,
    free_port,
    share_converted_tokenizers,
    wait_until,
)
from tokenyard.billing.models import UsageRecord

MODEL = "smollm2"


class Engine(Process):
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [*TOKENYARD, "engine", "--model", MODEL, "--port", str(self.port)]
        super().__init__([*command, "--num-blocks", "256"], env, log)

    def served(self) -> int:
        """Requests this engine has finished (its e2e histogram's count)."""
        text = httpx.get(self.url + "/metrics").text
        counts = [
            ln.split()[-1]
            for ln in text.splitlines()
            if ln.startswith("tokenyard_engine_e2e_seconds_count")
        ]
        return int(sum(float(c) for c in counts))


@pytest.fixture(scope="module")
def engines(
    base_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, converted_tokenizers: Path
) -> Iterator[list[Engine]]:
    share_converted_tokenizers(base_env, converted_tokenizers)
    logs = tmp_path_factory.mktemp("engines")
    env = {**base_env, "OMP_NUM_THREADS": "1"}  # two engines share two cores
    started = [Engine(env, logs / f"engine-{i}.log") for i in range(2)]
    for engine in started:
        wait_until(lambda e=engine: httpx.get(e.url + "/health").status_code == 200, 300, "engine")
    yield started
    for engine in started:
        engine.stop()


@pytest.fixture(scope="module")
def gateways(
    base_env: dict[str, str], engines: list[Engine], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Gateway]]:
    logs = tmp_path_factory.mktemp("gateways")
    env = {
        **base_env,
        "TOKENYARD_ENGINE_URLS": ",".join(f"{MODEL}={e.url}" for e in engines),
        "TOKENYARD_GATEWAY_DRAIN_S": "60",
    }
    started = [Gateway(env, logs / f"gateway-{i}.log") for i in range(2)]
    for gw in started:  # both replicas polled ready
        wait_until(lambda g=gw: httpx.get(g.url + "/ready").status_code == 200, 30, "ready")
    yield started
    for gw in started:
        gw.stop()


def _chat(gw: Gateway, key: str, text: str, max_tokens: int = 4, **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    headers = {"authorization": f"Bearer {key}", "x-request-id": "req-" + uuid.uuid4().hex}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def _stream(gw: Gateway, key: str, text: str, max_tokens: int, on_first: Any = None) -> dict:
    """One streamed request; returns its request id, data events and whether it ended with
    [DONE]. `on_first` runs once the first content event has arrived."""
    request_id = "req-" + uuid.uuid4().hex
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id}
    events: list[str] = []
    url = gw.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if on_first is not None and len(events) == 2:
                    on_first()
    return {"id": request_id, "events": events, "done": bool(events) and events[-1] == "[DONE]"}


def test_load_spreads_across_both_engines(
    gateways: list[Gateway], engines: list[Engine], team: Any
) -> None:
    _, key = team()
    before = [e.served() for e in engines]
    # each prompt's own prefix picks its replica by rendezvous hashing over the replicas' random
    # ports, so the split is a coin toss per prompt: 24 of them leave a replica under 3 once in
    # ~28,000 runs (16 did once in ~240, and a CI run met it)
    prompts = [f"Name a colour, please ({i}): {uuid.uuid4().hex}" for i in range(24)]
    with ThreadPoolExecutor(4) as pool:
        replies = list(
            pool.map(lambda ip: _chat(gateways[ip[0] % 2], key, ip[1]), enumerate(prompts))
        )
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert all(r.headers["x-tokenyard-model"] == MODEL for r in replies)
    served = [e.served() - b for e, b in zip(engines, before, strict=True)]
    assert sum(served) == 24
    assert min(served) >= 3, served  # both replicas took a real share


def test_team_quota_holds_across_gateways(gateways: list[Gateway], team: Any) -> None:
    _, key = team(rpm=6)
    statuses = [_chat(gateways[i % 2], key, "Hi", max_tokens=1).status_code for i in range(12)]
    assert statuses.count(200) == 6
    assert statuses.count(429) == 6


def test_sigterm_drains_a_gateway_with_its_streams_finishing(
    base_env: dict[str, str], engines: list[Engine], team: Any, tmp_path: Path
) -> None:
    env = {
        **base_env,
        "TOKENYARD_ENGINE_URLS": ",".join(f"{MODEL}={e.url}" for e in engines),
        "TOKENYARD_GATEWAY_DRAIN_S": "60",
    }
    gw = Gateway(env, tmp_path / "draining.log")
    wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, 30, "ready")
    _, key = team()
    result = _stream(
        gw,
        key,
        "Count slowly from one to fifty.",
        40,
        on_first=lambda: gw.proc.send_signal(signal.SIGTERM),
    )
    assert result["done"], result["events"][-3:]
    finish = [
        json.loads(e)["choices"][0]["finish_reason"]
        for e in result["events"][:-1]
        if json.loads(e)["choices"]
    ]
    assert finish[-1] == "length"
    # uvicorn re-raises the signal once it has shut down cleanly
    assert gw.proc.wait(30) in (0, -signal.SIGTERM)
    with pytest.raises(httpx.ConnectError):
        httpx.get(gw.url + "/health")
    gw.stop()


def test_sigterm_drains_an_engine_with_its_streams_finishing(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    """The engine's step loop runs on its main thread and HTTP in another; SIGTERM still reaches
    uvicorn, which stops accepting, lets the open stream finish, and the process exits."""
    engine = Engine({**base_env, "OMP_NUM_THREADS": "1"}, tmp_path / "engine.log")
    wait_until(lambda: httpx.get(engine.url + "/health").status_code == 200, 300, "engine")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count slowly from one to fifty."}],
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[str] = []
    url = engine.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:
                    engine.proc.send_signal(signal.SIGTERM)
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert sum(bool(c["choices"] and c["choices"][0]["delta"].get("content")) for c in chunks) > 1
    assert engine.proc.wait(30) in (0, -signal.SIGTERM)
    with pytest.raises(httpx.ConnectError):
        httpx.get(engine.url + "/health")
    engine.stop()


def test_killing_an_engine_mid_load(
    gateways: list[Gateway], engines: list[Engine], team: Any, sql: Any
) -> None:
    """Last in this module: it kills one of the engines."""
    _, key = team()
    started = {"n": 0}

    def under_way() -> None:
        started["n"] += 1

    with ThreadPoolExecutor(6) as pool:
        streams = [
            pool.submit(
                _stream,
                gateways[i % 2],
                key,
                f"Tell a long story about ship {i} {uuid.uuid4().hex}",
                120,
                under_way,
            )
            for i in range(6)
        ]
        wait_until(lambda: started["n"] == 6, 120, "every stream under way")
        # the victim is the replica with the most streams in flight: where the six went depends on
        # prefix affinity and on each replica's load as the gateways last polled it
        loads = [httpx.get(e.url + "/load").json()["running"] for e in engines]
        victim, survivor = engines if loads[0] >= loads[1] else engines[::-1]
        running = max(loads)
        assert running >= 1
        os.kill(victim.proc.pid, signal.SIGKILL)
        results = [f.result(timeout=180) for f in streams]
    broken = [r for r in results if not r["done"]]
    assert len(broken) == running
    for r in broken:
        assert json.loads(r["events"][-1])["error"]["code"] == "upstream_error"
    # new requests go to the survivor
    after = survivor.served()
    replies = [_chat(gateways[i % 2], key, f"Hi {i}").status_code for i in range(4)]
    assert replies == [200] * 4
    assert survivor.served() - after == 4
    # every stream, broken or not, is billed exactly once
    ids = {r["id"]: r for r in results}

    def billed() -> list[UsageRecord]:
        with Session(sql) as session:
            return list(
                session.exec(select(UsageRecord).where(UsageRecord.client_request_id.in_(ids)))
            )  # type: ignore[attr-defined]

    wait_until(lambda: len(billed()) == len(ids), 20, "usage records")
    for record in billed():
        if ids[record.client_request_id]["done"]:
            assert record.status == 200 and record.completion_tokens == 120
        else:
            assert record.status == 502 and record.completion_tokens > 0
