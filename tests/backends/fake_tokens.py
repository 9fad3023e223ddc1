"""A fake Microsoft Entra ID token endpoint, over HTTPS as azure-identity insists: the client
credentials grant at POST /{tenant}/oauth2/v2.0/token, as Microsoft's identity platform answers
it (a form body in; `token_type`, `expires_in`, `access_token` out; an AADSTS error with 401 for a
wrong client secret).

Tokens are `entra.<tenant>.<client_id>.<n>`: the fake Azure resource (fake_azure.py) takes a bearer
token of that form on a deployment's routes, as Azure takes Entra ID tokens there. A client secret
of "wrong" is refused. GET /stats: every grant asked for (tenant, client_id, client_secret, scope,
grant_type), in order. GET /health: 200.

Run: python tests/backends/fake_tokens.py --port P --certfile CERT --keyfile KEY
"""

import argparse
import base64
import json
from typing import Any
from urllib.parse import parse_qs

import msgspec


def make_app() -> Any:
    grants: list[dict[str, str]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"].split(".")[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        path, status, reply = scope["path"], 200, {}
        if scope["method"] == "GET":
            reply = {"grants": grants} if path == "/stats" else {"status": "ok"}
        else:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            tenant = path.split("/")[1]
            grants.append({"tenant": tenant, **form})
            if path == "/token":  # Google's: the claims of the signed assertion
                claims = form.get("assertion", "..").split(".")[1]
                padded = claims + "=" * (-len(claims) % 4)
                grants[-1] = {"grant_type": form.get("grant_type", "")}
                grants[-1] |= json.loads(base64.urlsafe_b64decode(padded))
                reply = {"token_type": "Bearer", "expires_in": 3599}
                reply["access_token"] = f"ya29.fake.{len(grants)}"
            elif not path.endswith("/oauth2/v2.0/token"):
                status, reply = 404, {"error": "not_found"}
            elif form.get("client_secret") == "wrong":
                status, reply = (
                    401,
                    {
                        "error": "invalid_client",
                        "error_description": "AADSTS7000215: Invalid client secret provided.",
                        "error_codes": [7000215],
                    },
                )
            else:
                token = f"entra.{tenant}.{form.get('client_id')}.{len(grants)}"
                reply = {"token_type": "Bearer", "expires_in": 3599, "access_token": token}
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": msgspec.json.encode(reply)})

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="fake OAuth token endpoints for tests")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--certfile", required=True)
    parser.add_argument("--keyfile", required=True)
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(
        make_app(),
        host="127.0.0.1",
        port=args.port,
        ssl_certfile=args.certfile,
        ssl_keyfile=args.keyfile,
        access_log=False,
        log_level="critical",
    )
