"""Which kind of endpoint (tenancy/limits.py SCOPES) a request's path is, for keys restricted to
some kinds (a team's or a key's `scopes`). A path not named here is open only to unrestricted
keys: a new route is closed to restricted ones until it is given its kind.
"""

from tokenyard.core.errors import GatewayError
from tokenyard.tenancy.policy import TeamPolicy

# path prefixes, each matched whole or followed by "/", the longer ones first
_KINDS = (
    ("/v1/messages/batches", "batch"),
    ("/v1/messages", "completions"),  # Anthropic's Messages and their token counts
    ("/v1/chat/completions", "completions"),  # stored chat completions included
    ("/v1/completions", "completions"),
    ("/v1/responses", "completions"),
    ("/v1/conversations", "completions"),
    ("/v1/prompts", "completions"),  # the Responses API's reusable prompts
    ("/v1/embeddings", "embeddings"),
    ("/v1/rerank", "embeddings"),  # retrieval, as embeddings are
    ("/v2/rerank", "embeddings"),
    ("/v1/moderations", "moderations"),
    ("/v1/images", "images"),
    ("/v1/audio", "audio"),
    ("/v1/batches", "batch"),
    ("/v1/batch", "batch"),  # the inline batch, and the team's webhook secret
    ("/v1/files", "batch"),
    ("/v1/usage", "usage"),
    ("/admin", "usage"),  # a team member's sign-in to the team's usage page
    ("/v1/feedback", "feedback"),
    ("/v1beta/cachedContents", "completions"),  # Gemini's context caches: content to generate on
)
GEMINI = "/v1beta/models"
OPEN = ("/v1/models",)  # listing the models: every key
CLOSED = "unrestricted"  # what a path of no kind needs: a key with no scopes


def scope_of(path: str) -> str | None:
    """The kind of endpoint `path` is; None: open to every key."""
    if any(path == p or path.startswith(p + "/") for p in OPEN):
        return None
    if path == GEMINI or path.startswith(GEMINI + "/"):
        _, colon, method = path.rsplit("/", 1)[-1].partition(":")
        if not colon:  # listing or reading a model
            return None
        # embedContent, batchEmbedContents; generateContent, streamGenerateContent, countTokens
        return "embeddings" if "embed" in method.lower() else "completions"
    for prefix, kind in _KINDS:
        if path == prefix or path.startswith(prefix + "/"):
            return kind
    return CLOSED


def check_scope(
    policy: TeamPolicy, path: str, *, doing: str = "call", param: str | None = None
) -> None:
    """Refuse (403 insufficient_scope) a key that may not call `path`: the request's own path, or
    the endpoint a batch would run its requests on (`doing` names that in the message)."""
    if policy.scopes and not policy.allows(scope := scope_of(path)):
        raise GatewayError(
            403,
            f"this key may not {doing} {path}: it is restricted to "
            f"{', '.join(s for s in policy.scopes if s) or 'no kind of endpoint'}, and this "
            f"endpoint is {scope}",
            code="insufficient_scope",
            param=param,
        )
