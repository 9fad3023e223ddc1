"""A GGUF's tokenizer is converted once (9 s for SmolLM2) and kept in the engine's cache folder;
later starts read it back (0.6 s) and tokenize exactly as the conversion does."""

import logging
import os

import pytest

from tokenyard.engine import tokenizer as tokenizer_module
from tokenyard.engine.tokenizer import Tokenizer, _converted_folder, _hf_tokenizer, _keep

TEXTS = [
    "Hello world",
    "  spaces\tand\nnewlines  ",
    "naïve café 東京 🙂",
    "<|im_start|>user\nhi<|im_end|>",
    "def f(x):\n    return x**2",
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture
def loads(monkeypatch):
    """The arguments of every AutoTokenizer.from_pretrained call."""
    calls = []
    real = tokenizer_module.AutoTokenizer.from_pretrained

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module.AutoTokenizer, "from_pretrained", recorded)
    return calls


def test_the_converted_tokenizer_is_kept_and_read_back_the_same(gguf_path, tmp_path, loads):
    converted = Tokenizer.load(gguf_path, (2,), str(tmp_path))
    assert "gguf_file" in loads[-1][1]  # the first load converts the GGUF
    folder = _converted_folder(gguf_path, str(tmp_path))
    assert (folder / "tokenizer.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging left behind

    kept = Tokenizer(_hf_tokenizer.__wrapped__(gguf_path, str(tmp_path)), (2,))
    assert loads[-1][0] == (folder,) and "gguf_file" not in loads[-1][1]
    assert [kept.encode(t) for t in TEXTS] == [converted.encode(t) for t in TEXTS]
    assert kept.apply_chat_template(CHAT) == converted.apply_chat_template(CHAT)
    ids = list(range(0, len(converted.hf), 97))
    assert kept.decode(ids) == converted.decode(ids)
    assert kept.decode(ids, skip_special_tokens=False) == converted.decode(ids, False)
    assert kept.eos_token_ids == converted.eos_token_ids
    assert kept.hf.bos_token_id == converted.hf.bos_token_id


def test_a_changed_file_is_converted_again(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    before = _converted_folder(str(model), "cache")
    os.utime(model, ns=(0, 12345))
    assert _converted_folder(str(model), "cache") != before
    model.write_bytes(b"GGUF, longer")
    assert len({before, _converted_folder(str(model), "cache")}) == 2


def test_a_cache_that_cannot_be_written_is_skipped_with_a_warning(gguf_path, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="tokenyard.engine"):
        # the arguments the engine passes: the conversion its tests made already (lru_cache
        # keys `(path,)` and `(path, "")` apart)
        _keep(_hf_tokenizer(gguf_path, ""), blocker / "tokenizers" / "smollm2")
    assert "was not kept" in caplog.text
