"""Truncation "auto" (the Responses API's field, and an extension on chat completions): a
conversation longer than the chosen model's context loses its oldest turns instead of being
refused, as OpenAI drops items from the beginning of the conversation.

Kept: every system and developer message (the instructions), and the last turn, from its user
message on (the one being answered, with the tool calls and results it has led to). Earlier turns
go whole and oldest first, a turn being a user message and what follows it up to the next: an
assistant's tool calls never lose their results, and the conversation still opens with a user
message, which providers require. Sizes are the gateway's estimate (validation.py), as every
context check is.
"""

from tokenyard.gateway.validation import Parsed, chat_tokens, message_bytes

_INSTRUCTIONS = ("system", "developer")


def fit(parsed: Parsed, budget: int) -> None:
    """Drop the oldest turns of a chat request until its prompt is at most `budget` tokens, or
    none is left to go: in place, its messages, its prompt's size and its count of dropped ones."""
    messages = parsed.body["messages"]
    sizes = [message_bytes(m) for m in messages]
    size, count = sum(sizes), len(sizes)
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    last_turn = users[-1] if users else 0
    earlier = [i for i in range(last_turn) if messages[i].get("role") not in _INSTRUCTIONS]
    gone: set[int] = set()
    j = 0
    while j < len(earlier) and chat_tokens(size, count) > budget:
        while True:  # the oldest turn: its first message and all up to the next user message
            gone.add(earlier[j])
            size, count, j = size - sizes[earlier[j]], count - 1, j + 1
            if j == len(earlier) or messages[earlier[j]].get("role") == "user":
                break
    if gone:
        parsed.body["messages"] = [m for i, m in enumerate(messages) if i not in gone]
        parsed.prompt_sizes = [chat_tokens(size, count)]
        parsed.dropped += len(gone)
