"""OpenAI's list object (`data`, `first_id`, `last_id`, `has_more`) over items that are read whole
and paged in memory: a stored response's input items, a stored chat completion's messages."""

from typing import Any, Literal

from tokenyard.core.errors import GatewayError


def list_object(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def page(
    items: list[dict[str, Any]],
    limit: int,
    order: Literal["asc", "desc"],
    after: str | None,
    missing: str,
) -> dict[str, Any]:
    """The page of `items` (in their stored order) after the one with id `after`; an `after` that
    is not among them is a 400 saying `missing`."""
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise GatewayError(400, missing, param="after")
        items = items[ids.index(after) + 1 :]
    return list_object(items[:limit], len(items) > limit)
