"""The gateway tests' fake upstream (tests/gateway/fake_upstream.py), reporting engine time: every
request's `timings.compute` is the given seconds, so self-hosted attribution has something to
price.

Run: python tests/billing/fake_engine.py --port P --model NAME --compute SECONDS
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))
from fake_upstream import make_app


def with_compute(app: Any, seconds: float) -> Any:
    reported = f'"compute":{seconds}'.encode()

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        async def patched(message: dict) -> None:
            if message["type"] == "http.response.body":
                message["body"] = message["body"].replace(b'"compute":0.0', reported)
            await send(message)

        await app(scope, receive, patched)

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake")
    parser.add_argument("--compute", type=float, required=True)
    args = parser.parse_args()
    app = with_compute(make_app(args.model, 16, 2048), args.compute)
    uvicorn.run(app, host="127.0.0.1", port=args.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
