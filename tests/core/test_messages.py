"""A message content's text, as the router and the safety screen read it."""

from tokenyard.core.messages import content_text


def test_a_string_is_its_own_text() -> None:
    assert content_text("hello") == "hello"


def test_text_parts_one_per_line_and_the_rest_left_out() -> None:
    content = [
        {"type": "text", "text": "first"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "second"},
        {"type": "text", "text": 7},  # not text: validation refuses it before anyone reads it
        "not a part",
    ]
    assert content_text(content) == "first\nsecond"


def test_no_content_has_no_text() -> None:
    assert content_text(None) == ""
    assert content_text({"text": "a dict is not a content"}) == ""
