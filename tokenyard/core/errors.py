"""OpenAI-style errors: every refusal the platform makes leaves through here."""

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

log = logging.getLogger("tokenyard")

# OpenAI's types per status (a bad key is an `invalid_request_error` there too)
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
        kind: str | None = None,
        limit: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after
        # the error's `type` where OpenAI's differs from the status's usual one
        self.kind = kind or _TYPES.get(status, "server_error" if status >= 500 else "api_error")
        self.limit = limit  # the quota that refused, in the x-tokenyard-limit header
        self.extra_headers = headers or {}

    def body(self) -> bytes:
        detail = ErrorDetail(message=self.message, type=self.kind, param=self.param, code=self.code)
        return msgspec.json.encode(ErrorBody(error=detail))

    def headers(self) -> dict[str, str]:
        headers = {} if self.retry_after is None else {"retry-after": str(self.retry_after)}
        if self.limit is not None:
            headers["x-tokenyard-limit"] = self.limit
        return {**headers, **self.extra_headers}

    def response(self) -> Response[bytes]:
        return Response(
            self.body(),
            status_code=self.status,
            media_type="application/json",
            headers=self.headers(),
        )


def refusal_message(raw: bytes) -> str:
    """The message of an OpenAI-shaped refusal (the gateway's or an upstream's), to answer it in
    another protocol's error shape."""
    try:
        return str(msgspec.json.decode(raw)["error"]["message"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return "the model's server refused the request"


def gateway_error_handler(_: Request, exc: GatewayError) -> Response[bytes]:
    return exc.response()


def http_error_handler(request: Request, exc: HTTPException) -> Response[bytes]:
    """Litestar's own refusals (413 body too large, 404 route, 405 method) in OpenAI's shape; an
    unknown path says where the endpoints are listed."""
    codes = {413: "request_too_large", 404: "not_found", 405: "method_not_allowed"}
    message = str(exc.detail)
    if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
        message = (
            f"{message}: {request.method} {request.url.path}. The endpoints and their methods are "
            "listed in /schema/openapi.json (OpenAI's routes are under /v1)"
        )
    err = GatewayError(exc.status_code, message, code=codes.get(exc.status_code))
    return err.response()


def internal_error_handler(_: Request, exc: Exception) -> Response[bytes]:
    log.exception("unhandled error", exc_info=exc)
    return GatewayError(500, "internal error", code="internal_error").response()
