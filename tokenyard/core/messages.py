"""The text of an OpenAI message `content`, as the platform's readers of prompts take it (the
router's complexity classifier and prefix affinity, the safety screen)."""

from typing import Any


def content_text(content: Any) -> str:
    """The string itself, or the texts of its parts one per line; parts without text (images,
    audio) and contents of any other shape give nothing (validation has already refused those a
    request may not carry)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") for p in content if isinstance(p, dict))
        return "\n".join(t for t in parts if isinstance(t, str))
    return ""
