"""`tokenyard gateway`: the platform's app (tokenyard/app.py, every package's routes) under
uvicorn, with the gateway's own access log."""

import argparse
from typing import Any

from tokenyard.core.settings import Settings, get_settings


def serve(settings: Settings, host: str, port: int) -> None:
    import uvicorn

    from tokenyard.app import create_app
    from tokenyard.gateway.access_log import AccessLog

    app = create_app(settings)
    # the gateway's own access log (gateway/access_log.py) in place of uvicorn's, which knows no
    # request id, team or tokens
    uvicorn.run(
        AccessLog(app) if settings.gateway_access_log else app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        # SIGTERM: stop accepting, give in-flight requests and streams this long, then cancel them
        timeout_graceful_shutdown=settings.gateway_drain_s or None,
        proxy_headers=True,
        forwarded_allow_ips=settings.gateway_trusted_proxies,
    )


def _gateway(args: argparse.Namespace) -> int:
    settings = get_settings()
    serve(settings, args.host or settings.gateway_host, args.port or settings.gateway_port)
    return 0


def listen_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", default=None, help="address to listen on (default: TOKENYARD_GATEWAY_HOST)"
    )
    p.add_argument(
        "--port", type=int, default=None, help="port to listen on (default: TOKENYARD_GATEWAY_PORT)"
    )


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gateway", help="run the OpenAI-compatible gateway")
    listen_flags(p)
    p.set_defaults(run=_gateway)
