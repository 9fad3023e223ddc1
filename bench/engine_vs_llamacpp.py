"""The engine against llama.cpp's `llama-server` on the same GGUF, the same chat workload and the
same streaming client, one server at a time on this machine.

llama-server is built once from the vendored llama.cpp of the `llama-cpp-python` sdist (pip
download, cmake; ~20 minutes on 2 cores) and cached under var/llamacpp (ignored by git). It serves
16 slots (`-np 16`). The workload is bench/engine_throughput.py's: chat prompts of 30-600 tokens,
outputs of 16-256 tokens, EOS ignored, greedy; sent at concurrency 1 (--single requests), 16 and 64
(--requests each). Every phase (and the warm-up) draws its own prompts (seeds seed .. seed + 3), so
that no server answers a phase from prompts it cached in an earlier one: both keep prompt caches
(the engine's prefix cache holds every earlier prompt; llama-server's slots their last one).
Before 2026-11-26 every phase re-sent the same prompts, which let the engine's prefix cache skip
most prefill at 16 and 64 (bench/RESULTS.md). Reported per server and concurrency: output tok/s,
time per output token p50 (a request's (last token - first token) / (tokens - 1)), TTFT p50, and
the server's peak RSS; then the ratios against the issue's targets.

    .venv/bin/python bench/engine_vs_llamacpp.py [--requests 64] [--single 16]
        [--quantization auto] [--engine-args "..."]
"""

import argparse
import asyncio
import glob
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
from engine_throughput import make_workload, pct

from tokenyard.engine.loader import resolve_model_path
from tokenyard.engine.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "var" / "llamacpp"
# gcc lets an explicit -mno-* win over -march=native whatever their order: AMX off, the rest native
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


# ---------------------------------------------------------------- llama-server


def build_llama_server(amx: bool = True) -> Path:
    """The cached binary, or build it: the sdist's vendored llama.cpp, server target only; with
    `amx` False, a second build whose ggml has no AMX code, which runs with its default repacking
    on AMX CPUs, where the AMX build crashes (repacking applies to formats with a repacked layout:
    Q4_1 has none in 0.3.36)."""
    build_dir = CACHE / ("build" if amx else "build-noamx")
    server = build_dir / "bin" / "llama-server"
    if server.exists():
        return server
    CACHE.mkdir(parents=True, exist_ok=True)
    sdists = glob.glob(str(CACHE / "llama_cpp_python-*.tar.gz"))
    if not sdists:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, "llama-cpp-python", "-d", str(CACHE)], check=True)
        sdists = glob.glob(str(CACHE / "llama_cpp_python-*.tar.gz"))
    source_dir = CACHE / Path(sdists[0]).name.removesuffix(".tar.gz")
    if not source_dir.exists():
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(CACHE, filter="data")
    llama = source_dir / "vendor" / "llama.cpp"
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",  # this CPU's instructions, as the engine's kernels get
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DBUILD_SHARED_LIBS=OFF",
    ]
    if not amx:
        flags += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    print(f"building llama-server from {llama} (~20 min on 2 cores)", flush=True)
    subprocess.run(["cmake", "-S", str(llama), "-B", str(build_dir), *flags], check=True)
    jobs = str(os.cpu_count() or 2)
    build = ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", jobs]
    subprocess.run(build, check=True)
    return server


# ---------------------------------------------------------------- servers and client


class Server:
    """A server process on a port, up once /health answers; its peak RSS read from /proc."""

    def __init__(self, name: str, cmd: list[str], port: int) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        CACHE.mkdir(parents=True, exist_ok=True)  # the logs' place, llama.cpp built or not
        log = open(CACHE / f"{name.split()[0]}.log", "w")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: see {log.name}")
            try:
                if httpx.get(f"{self.url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} not up after 600 s")

    def peak_rss_gib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        return kib / 2**20

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


async def drive(url: str, work, concurrency: int) -> dict:
    """Every request of `work` streamed, at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    per_token: list[float] = []
    total = 0
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as http:

        async def stream(body: dict, stamps: list[float]) -> None:
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choices = json.loads(line[6:]).get("choices") or []
                    if choices and choices[0].get("delta", {}).get("content"):
                        stamps.append(time.perf_counter())

        async def one(messages, out_len: int) -> None:
            nonlocal total
            body = {
                "model": "smollm2",
                "messages": messages,
                "max_tokens": out_len,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            async with gate:
                for attempt in range(3):
                    sent = time.perf_counter()
                    stamps: list[float] = []
                    try:
                        await stream(body, stamps)
                        break
                    except httpx.RemoteProtocolError:
                        # llama-server's HTTP layer sometimes drops a kept-alive connection
                        # before answering; nothing was generated, so the request is resent
                        if stamps or attempt == 2:
                            raise
            if stamps:
                ttfts.append(stamps[0] - sent)
                total += len(stamps)
            if len(stamps) > 1:
                per_token.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))

        start = time.perf_counter()
        await asyncio.gather(*(one(m, n) for m, _, n in work))
        elapsed = time.perf_counter() - start
    return {
        "tok/s": total / elapsed,
        "tpot_p50": pct(per_token, 0.5),
        "ttft_p50": pct(ttfts, 0.5),
    }


def run(server: Server, phases: dict[int, list], warm_up: list) -> dict[int, dict]:
    rows = {}
    asyncio.run(drive(server.url, warm_up, 1))  # kernels built, caches touched
    for concurrency, requests in phases.items():
        row = asyncio.run(drive(server.url, requests, concurrency))
        rows[concurrency] = row
        print(
            f"{server.name:<28} c={concurrency:<3} {row['tok/s']:7.1f} tok/s  time/token p50 "
            f"{row['tpot_p50'] * 1e3:6.1f} ms  TTFT p50 {row['ttft_p50'] * 1e3:7.0f} ms",
            flush=True,
        )
    rows[0] = {"rss_gib": server.peak_rss_gib()}
    print(f"{server.name:<28} peak RSS {rows[0]['rss_gib']:.2f} GiB", flush=True)
    return rows


def cpu_flags() -> str:
    info = Path("/proc/cpuinfo").read_text()
    line = next(x for x in info.splitlines() if x.startswith("flags"))
    present = set(line.split(":", 1)[1].split())
    model = next(x for x in info.splitlines() if x.startswith("model name")).split(":", 1)[1]
    return f"{model.strip()}, {os.cpu_count()} CPUs: " + " ".join(
        f for f in CPU_FLAGS if f in present
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--single", type=int, default=16, help="requests sent one at a time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quantization", default="auto", help="the engine's --quantization")
    parser.add_argument("--engine-args", default="", help="more `tokenyard engine` arguments")
    parser.add_argument("--port", type=int, default=8297)
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--skip-engine", action="store_true", help="llama-server alone")
    parser.add_argument(
        "--llamacpp-args",
        default="",
        help="more llama-server arguments (on AMX CPUs its repacked weights crash with "
        "SIGSEGV in the build it makes: pass --no-repack, or use --llamacpp-no-amx)",
    )
    parser.add_argument(
        "--llamacpp-no-amx",
        action="store_true",
        help="llama-server built without AMX code (var/llamacpp/build-noamx), which runs on AMX "
        "CPUs with its default repacking (for formats that have a repacked layout)",
    )
    args = parser.parse_args()

    gguf = resolve_model_path("smollm2")
    tokenizer = Tokenizer.load(gguf, ())
    # each phase its own prompts: none is answered from another phase's cached prefixes
    phases = {
        1: make_workload(tokenizer, args.single, args.seed, None),
        16: make_workload(tokenizer, args.requests, args.seed + 1, None),
        64: make_workload(tokenizer, args.requests, args.seed + 2, None),
    }
    warm_up = make_workload(tokenizer, 2, args.seed + 3, None)
    print(f"CPU: {cpu_flags()}")
    for concurrency, work in phases.items():
        print(
            f"workload at c={concurrency}: {len(work)} chat requests, "
            f"{sum(len(i) for _, i, _ in work)} prompt tokens, "
            f"{sum(n for _, _, n in work)} output tokens (EOS ignored, greedy)"
        )
    threads = str(os.cpu_count() or 2)
    results: dict[str, dict[int, dict]] = {}
    tokenyard = os.path.join(os.path.dirname(sys.executable), "tokenyard")
    ours = [tokenyard, "engine", "--port", str(args.port), "--quantization", args.quantization]
    ours += ["--max-seqs", str(args.requests), *shlex.split(args.engine_args)]
    servers = [] if args.skip_engine else [(f"tokenyard engine ({args.quantization})", ours)]
    if not args.skip_llamacpp:
        binary = build_llama_server(amx=not args.llamacpp_no_amx)
        # one slot's context holds the longest request: 16 slots of 2048 tokens
        llama = [str(binary), "-m", gguf, "--port", str(args.port + 1), "-np", "16"]
        llama += ["-c", str(16 * 2048), "-t", threads, "--jinja", *shlex.split(args.llamacpp_args)]
        servers.append(("llama-server -np 16", llama))
    for name, cmd in servers:
        port = int(cmd[cmd.index("--port") + 1])
        server = Server(name, cmd, port)
        try:
            results[name] = run(server, phases, warm_up)
        finally:
            server.stop()

    if len(results) == 2:
        (a_name, a), (_, b) = results.items()
        print(f"\nratios ({a_name} / llama-server)")
        tpot = a[1]["tpot_p50"] / b[1]["tpot_p50"]
        ttft = a[1]["ttft_p50"] / b[1]["ttft_p50"]
        print(f"  one at a time, time per output token p50: {tpot:5.2f}x  (target <= 0.8x)")
        print(f"  one at a time, TTFT p50:                  {ttft:5.2f}x  (target <= 1x)")
        for c in (16, 64):
            print(
                f"  {c} at once, output tok/s:                {a[c]['tok/s'] / b[c]['tok/s']:5.2f}x"
                "  (target >= 3x)"
            )
        print(f"  peak RSS: {a[0]['rss_gib']:.2f} GiB vs {b[0]['rss_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
