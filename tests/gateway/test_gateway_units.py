"""In-process checks of the pieces with arithmetic in them: estimates, pages, chunked decoding."""

import pytest

from backends.base import ModelInfo
from backends.http import _dechunk
from gateway.errors import GatewayError
from gateway.quotas import kv_pages
from gateway.validation import estimate_prompt_tokens, parse


def test_estimates_and_pages() -> None:
    chat = parse(b'{"model": "m", "messages": [{"role": "user", "content": "12345678"}]}', "chat")
    assert chat.prompt_tokens == 2 + 5 + 3  # 8 bytes / 4, one message, the reply's opening
    assert estimate_prompt_tokens([1, 2, 3, 4, 5]) == 5  # token ids are counted exactly
    assert estimate_prompt_tokens(["abcd", "abcdefgh"]) == 2  # a batch reserves its largest
    assert kv_pages(10, 22, 1, 16) == 2
    assert kv_pages(10, 23, 2, 16) == 6  # each choice holds its own blocks
    assert kv_pages(10, 23, 1, 0) == 0  # not a paged engine


@pytest.mark.parametrize(
    ("raw", "kind", "param"),
    [
        (b'{"model": "m", "messages": [], "max_tokens": 0}', "chat", "messages"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}', "chat", "max_tokens"),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": "9"}',
            "chat",
            "max_tokens",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "chat", "model"),
        (b'{"model": "m", "prompt": [{"x": 1}]}', "completion", "prompt"),
        (b'{"model": "m"}', "completion", "prompt"),
        (b'{"model": "m", "prompt": "x", "n": 99}', "completion", "n"),
        (b'{"model": "m", "prompt": "x", "tier": "vip"}', "completion", "tier"),
    ],
)
def test_bad_requests_name_the_param(raw: bytes, kind: str, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        parse(raw, kind)  # type: ignore[arg-type]
    assert err.value.status == 400
    assert err.value.param == param


def test_dechunk_across_reads() -> None:
    wire = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    out, rest, done = b"", b"", False
    for i in range(0, len(wire), 3):  # arbitrary read boundaries
        pieces, rest, done = _dechunk(rest + wire[i : i + 3])
        out += pieces
    assert (out, rest, done) == (b"hello world", b"", True)


def test_prompt_overhead_is_learned_and_never_negative() -> None:
    info = ModelInfo("m")
    for _ in range(60):  # the template adds ~20 tokens the byte estimate cannot see
        info.observe_prompt(estimate=11, actual=32)
    assert info.prompt_extra == 21
    for _ in range(60):
        info.observe_prompt(estimate=40, actual=30)  # an estimate above the truth adds nothing
    assert info.prompt_extra == 0
