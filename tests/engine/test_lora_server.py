"""LoRA adapters over the engine's HTTP server, through the official openai SDK: named as models,
listed with their parent, loaded and unloaded at run time where the operator allows it."""

import httpx
import openai
import pytest

from tests.lora_files import PROJECTIONS, lora_tensors, write_adapter
from tokenyard.engine.cli import _name_and_path

from .test_server import server, serving_engine  # noqa: F401 - `server`: the fixture, by name

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def adapter_path(tmp_path_factory, engine_factory):
    config = engine_factory(num_blocks=256).model_config
    tensors = lora_tensors(config, 8, tuple(PROJECTIONS), seed=7)
    return write_adapter(tmp_path_factory.mktemp("lora") / "support", tensors, 8, 16, PROJECTIONS)


@pytest.fixture(scope="module")
def lora_server(engine_factory, adapter_path):
    """An engine started with one adapter (as `--lora support=PATH` does) and runtime loading on."""
    core = engine_factory(num_blocks=256, allow_runtime_lora=True)
    if core.runner.adapters.get("support") is None:
        core.runner.adapters.add("support", adapter_path)
    with serving_engine(core) as url:
        yield url


@pytest.fixture
def client(lora_server):
    return openai.OpenAI(base_url=lora_server + "/v1", api_key="unused")


def answer(client, model: str, **kw) -> str:
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=12, temperature=0, **kw
    )
    assert reply.model == model
    return reply.choices[0].message.content


def test_models_lists_adapters_under_their_parent(client):
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) >= {"smollm2", "support"}
    assert cards["support"].model_extra["parent"] == "smollm2"
    assert "parent" not in cards["smollm2"].model_extra


def test_a_request_names_its_adapter_as_the_model(client, lora_server):
    tuned, base = answer(client, "support"), answer(client, "smollm2")
    assert tuned != base
    assert answer(client, "support") == tuned  # greedy: the same adapter, the same answer
    stream = client.chat.completions.create(
        model="support", messages=QUESTION, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert {c.model for c in chunks} == {"support"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == tuned
    text = client.completions.create(model="support", prompt="Colours:", max_tokens=4)
    assert text.model == "support"
    metrics = httpx.get(lora_server + "/metrics").text
    series = 'tokenyard_engine_generated_tokens_total{model="support",priority="interactive"}'
    assert series in metrics  # the adapter's requests are a series of their own


def test_unknown_model_is_404_naming_what_is_served(client):
    with pytest.raises(openai.NotFoundError) as err:
        answer(client, "nope")
    assert err.value.body["code"] == "model_not_found"
    assert "'support'" in err.value.body["message"]


def test_runtime_load_and_unload(client, lora_server, adapter_path):
    load = httpx.post(
        f"{lora_server}/v1/load_lora_adapter",
        json={"lora_name": "hot", "lora_path": adapter_path},
    )
    assert load.status_code == 200, load.text
    assert load.json() == {"object": "lora_adapter", "id": "hot", "loaded": True}
    assert "hot" in {m.id for m in client.models.list().data}
    assert answer(client, "hot") == answer(client, "support")  # the same matrices
    again = httpx.post(
        f"{lora_server}/v1/load_lora_adapter",
        json={"lora_name": "hot", "lora_path": adapter_path},
    )
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    assert again.json()["error"]["param"] == "lora_name"
    unload = httpx.post(f"{lora_server}/v1/unload_lora_adapter", json={"lora_name": "hot"})
    assert unload.status_code == 200 and unload.json()["loaded"] is False
    with pytest.raises(openai.NotFoundError):
        answer(client, "hot")
    gone = httpx.post(f"{lora_server}/v1/unload_lora_adapter", json={"lora_name": "hot"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"lora_name": "x", "lora_path": "/nonexistent"}, "lora_path", "invalid_lora_adapter"),
        ({"lora_name": "smollm2", "lora_path": "/tmp"}, "lora_name", None),
        ({"lora_name": "x"}, None, None),
        ({"lora_name": "x", "lora_path": "/tmp", "extra": 1}, None, None),
    ],
)
def test_bad_loads_are_400s(lora_server, body, param, code):
    reply = httpx.post(f"{lora_server}/v1/load_lora_adapter", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param:
        assert error["param"] == param
    if code:
        assert error["code"] == code


def test_runtime_loading_is_off_unless_allowed(server, adapter_path):  # noqa: F811
    url, _ = server
    for route, body in (
        ("load_lora_adapter", {"lora_name": "x", "lora_path": adapter_path}),
        ("unload_lora_adapter", {"lora_name": "x"}),
    ):
        reply = httpx.post(f"{url}/v1/{route}", json=body)
        assert reply.status_code == 403
        assert reply.json()["error"]["code"] == "runtime_lora_disabled"


def test_cli_lora_flag_is_name_equals_path():
    assert _name_and_path("support=/models/support") == ("support", "/models/support")
    assert _name_and_path("a=b=c") == ("a", "b=c")
    for bad in ("support", "=path", "name="):
        with pytest.raises(SystemExit, match="NAME=PATH"):
            _name_and_path(bad)


def test_adapters_from_the_environment(monkeypatch):
    """TOKENYARD_ENGINE_LORA gives `tokenyard engine` (and so `tokenyard up`) its --lora flags; a
    flag on the command line adds to them."""
    import argparse

    from tokenyard.core import settings
    from tokenyard.engine import cli

    monkeypatch.setenv("TOKENYARD_ENGINE_LORA", "support=/srv/support, legal=/srv/legal")
    settings.get_settings.cache_clear()
    try:
        parser = argparse.ArgumentParser()
        cli.add_parser(parser.add_subparsers())
        args = parser.parse_args(["engine", "--lora", "extra=/srv/extra"])
    finally:
        settings.get_settings.cache_clear()
    assert dict(map(_name_and_path, args.lora)) == {
        "support": "/srv/support",
        "legal": "/srv/legal",
        "extra": "/srv/extra",
    }
