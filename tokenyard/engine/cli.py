"""`tokenyard engine`: load a model and serve it over HTTP."""

import argparse
import logging
import os
import signal
import threading

from tokenyard.core.settings import get_settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = get_settings()
    p = sub.add_parser(
        "engine", help="serve a Llama model with the paged continuous-batching engine"
    )
    p.add_argument(
        "--model",
        default=s.engine_model,
        help="'smollm2' (packaged), a GGUF file or a Hugging Face directory",
    )
    p.add_argument("--host", default=s.engine_host)
    p.add_argument("--port", type=int, default=s.engine_port)
    p.add_argument("--device", default=s.engine_device, help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default=s.engine_dtype, help="auto | float32 | bfloat16 | float16")
    p.add_argument(
        "--quantization",
        default=s.engine_quantization,
        help="CPU weights: auto (a GGUF as shipped) | none (float) | int8 | int4 (at load)",
    )
    p.add_argument(
        "--no-cpu-kernel",
        action="store_true",
        default=not s.engine_cpu_kernel,
        help="PyTorch SDPA and ops instead of the compiled CPU attention kernels and layer ops",
    )
    p.add_argument("--block-size", type=int, default=s.engine_block_size)
    p.add_argument("--kv-cache-gib", type=float, default=s.engine_kv_cache_gib)
    p.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "int8"),
        default=s.engine_kv_cache_dtype,
        help="auto: the model's dtype | int8: a scale per row, ~1.9x the tokens of bf16 (CPU)",
    )
    p.add_argument("--num-blocks", type=int, default=0, help="KV blocks (overrides --kv-cache-gib)")
    p.add_argument("--max-batched-tokens", type=int, default=s.engine_max_batched_tokens)
    p.add_argument("--max-seqs", type=int, default=s.engine_max_seqs)
    p.add_argument("--max-model-len", type=int, default=0)
    p.add_argument("--no-prefix-caching", action="store_true", default=not s.engine_prefix_caching)
    p.add_argument(
        "--speculative-tokens",
        type=int,
        default=0,
        help="n-gram speculative decoding: draft tokens per sequence and step (0: off)",
    )
    p.add_argument(
        "--prediction-tokens",
        type=int,
        default=8,
        help="draft tokens per step of a request that predicts its output (OpenAI's `prediction`; "
        "0: predictions are ignored)",
    )
    p.add_argument("--served-model-name", default="")
    p.add_argument(
        "--lora",
        action="append",
        default=[spec.strip() for spec in s.engine_lora.split(",") if spec.strip()],
        metavar="NAME=PATH",
        help="serve the PEFT LoRA adapter at PATH as model NAME beside the base model (repeatable)",
    )
    p.add_argument("--max-loras", type=int, default=8, help="adapters loaded at once, at most")
    p.add_argument(
        "--allow-runtime-lora",
        action="store_true",
        help="let /v1/load_lora_adapter and /v1/unload_lora_adapter change the adapters",
    )
    p.add_argument(
        "--drain-s",
        type=float,
        default=s.engine_drain_s,
        help="on SIGTERM, seconds running requests may take to finish (0: no deadline)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from tokenyard.engine.async_engine import AsyncEngine
    from tokenyard.engine.config import EngineConfig
    from tokenyard.engine.engine import LLMEngine
    from tokenyard.engine.server import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        cpu_kernel=not args.no_cpu_kernel,
        block_size=args.block_size,
        kv_cache_gib=args.kv_cache_gib,
        kv_cache_dtype=args.kv_cache_dtype,
        num_blocks=args.num_blocks,
        max_num_batched_tokens=args.max_batched_tokens,
        max_num_seqs=args.max_seqs,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        speculative_tokens=args.speculative_tokens,
        prediction_tokens=args.prediction_tokens,
        served_model_name=args.served_model_name,
        lora_modules=dict(_name_and_path(spec) for spec in args.lora),
        max_loras=args.max_loras,
        allow_runtime_lora=args.allow_runtime_lora,
        cache_dir=os.path.join(get_settings().data_dir, "engine"),
    )
    engine = AsyncEngine(LLMEngine(config))
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine),
            host=args.host,
            port=args.port,
            log_level="warning",
            timeout_graceful_shutdown=args.drain_s or None,
        )
    )
    # HTTP in a thread, the step loop on the main thread (why: engine/async_engine.py). Signals
    # reach the main thread only, so uvicorn's handler is installed here: the first SIGTERM or
    # SIGINT drains, a second one stops at once; the loop ends when the server has.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, server.handle_exit)
    http = threading.Thread(target=server.run, name="http")
    http.start()
    engine.run(until=lambda: not http.is_alive())
    http.join()


def _name_and_path(spec: str) -> tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--lora {spec!r}: expected NAME=PATH")
    return name, path
