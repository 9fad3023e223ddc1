"""`tokenyard embeddings`: serve all-MiniLM-L6-v2 over OpenAI's /v1/embeddings."""

import argparse

from tokenyard.core.settings import get_settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = get_settings()
    p = sub.add_parser(
        "embeddings", help="serve the sentence-embedding model (all-MiniLM-L6-v2) over HTTP"
    )
    p.add_argument("--host", default=s.embeddings_host)
    p.add_argument("--port", type=int, default=s.embeddings_port)
    p.add_argument(
        "--max-batch",
        type=int,
        default=s.embeddings_max_batch,
        help="inputs per forward pass (default %(default)s)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=s.embeddings_max_wait_ms,
        help="how long a batch waits for more requests after its first (ms, default %(default)s)",
    )
    p.add_argument("--served-model-name", default="", help="the name /load reports")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from tokenyard.embeddings.model import NAME, MiniLM
    from tokenyard.embeddings.server import create_app

    app = create_app(
        MiniLM(), args.max_batch, args.max_wait_ms / 1000, args.served_model_name or NAME
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
