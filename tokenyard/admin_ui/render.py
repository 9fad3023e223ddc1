"""HTML pages from the Jinja templates in admin_ui/templates (autoescaped)."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Request, Response
from litestar.enums import MediaType

from tokenyard.admin_ui import csrf, sessions
from tokenyard.admin_ui.charts import fmt
from tokenyard.tenancy.limits import SCOPES, model_limits_text

_env = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=StrictUndefined,  # a missing variable is a bug, not an empty string
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["fmt"] = fmt
# unix seconds as a UTC time, to the second
_env.filters["utc"] = lambda unix: datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S")
_env.filters["model_limits"] = model_limits_text
_env.globals["all_scopes"] = SCOPES

# no script at all; styles and forms from here only; never framed
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",  # pages show quotas, usage and (once) secrets
}


async def page(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    session = await sessions.load(request)
    html = _env.get_template(template).render(
        csrf_field=csrf.FIELD,
        csrf_token=await csrf.token(request),
        role=session.role if session else None,
        path=request.url.path,
        **context,
    )
    response = Response(html, status_code=status, media_type=MediaType.HTML, headers=HEADERS)
    csrf.set_anon_cookie(request, response)
    return response


def error(status: int, message: str) -> Response:
    """An error page; synchronous, as Litestar calls exception handlers."""
    html = _env.get_template("error.html").render(status=status, message=message, role=None)
    return Response(html, status_code=status, media_type=MediaType.HTML, headers=HEADERS)
