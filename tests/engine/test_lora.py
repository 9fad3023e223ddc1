"""LoRA adapters served beside the base model: against transformers with the adapter merged into
the weights, in batches that mix adapters, with the prefix cache and speculation."""

import copy

import pytest
import torch

from tests.lora_files import PROJECTIONS, lora_tensors, write_adapter
from tokenyard.engine.lora import AdapterError, Adapters, load_adapter
from tokenyard.engine.sequence import GenerationRequest

from .conftest import assert_all_blocks_free, greedy, reference_greedy, run_to_completion
from .prompts import chat_prompts

MAX_NEW = 16
# two adapters: every projection (rank 8), and only Q and V at another rank (PEFT's default
# targets), so the fused Q/K/V projection is partly adapted
ADAPTERS = {
    "all": dict(rank=8, alpha=16.0, targets=tuple(PROJECTIONS), seed=1),
    "qv": dict(rank=4, alpha=8.0, targets=("q_proj", "v_proj"), seed=2, use_rslora=True),
}


def scale(spec) -> float:
    rank, alpha = spec["rank"], spec["alpha"]
    return alpha / rank**0.5 if spec.get("use_rslora") else alpha / rank


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, engine_factory):
    config = engine_factory(num_blocks=512).model_config
    root = tmp_path_factory.mktemp("lora")
    dirs, tensors = {}, {}
    for name, spec in ADAPTERS.items():
        tensors[name] = lora_tensors(config, spec["rank"], spec["targets"], spec["seed"])
        extra = {"use_rslora": True} if spec.get("use_rslora") else {}
        dirs[name] = write_adapter(
            root / name, tensors[name], spec["rank"], spec["alpha"], spec["targets"], **extra
        )
    return dirs, tensors


def with_adapters(engine, dirs):
    for name, path in dirs.items():
        if engine.runner.adapters.get(name) is None:
            engine.runner.adapters.add(name, path)
    return engine


@pytest.fixture(scope="module")
def prompt_ids(engine_factory):
    tokenizer = engine_factory(num_blocks=512).tokenizer
    return [tokenizer.apply_chat_template(m) for m in chat_prompts()[:6]]


def merged_reference(reference, tensors, spec):
    """transformers' model with W + s·B·A written into each adapted projection."""
    model = copy.deepcopy(reference)
    s = scale(spec)
    with torch.no_grad():
        for layer in range(model.config.num_hidden_layers):
            for proj in spec["targets"]:
                prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[proj]}.{proj}"
                a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
                module = getattr(getattr(model.model.layers[layer], PROJECTIONS[proj]), proj)
                module.weight += s * (b @ a)
    return model.eval()


def generate(engine, prompts, adapters, **params) -> list[list[int]]:
    """Greedy outputs of the prompts, all added at once (one batch), prompt i with adapters[i]."""
    requests = [
        GenerationRequest(
            f"r{i}",
            ids,
            greedy(MAX_NEW, min_tokens=MAX_NEW, **params),
            adapter=engine.runner.adapters.get(name) if name else None,
        )
        for i, (ids, name) in enumerate(zip(prompts, adapters, strict=True))
    ]
    out = run_to_completion(engine, requests)
    return [[t for o in out[f"r{i}"] for t in o.token_ids] for i in range(len(prompts))]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_adapter_matches_transformers_with_merged_weights(
    engine_factory, reference, adapter_dirs, prompt_ids, name
):
    dirs, tensors = adapter_dirs
    engine = with_adapters(engine_factory(num_blocks=512), dirs)
    merged = merged_reference(reference, tensors[name], ADAPTERS[name])
    ids = prompt_ids[:2]
    ours = generate(engine, ids, [name] * len(ids))
    base = generate(engine, ids, [None] * len(ids))
    for i, prompt in enumerate(ids):
        assert ours[i] == reference_greedy(merged, prompt, MAX_NEW, ours[i]), f"prompt {i}"
    assert ours != base, "the adapter was meant to change the output"
    assert_all_blocks_free(engine)


def test_a_batch_mixing_adapters_matches_each_alone(engine_factory, adapter_dirs, prompt_ids):
    """Base, one adapter and the other side by side in the same steps (prefills and decodes):
    each output equals the same request run alone. (The compiled decode path, which quantized
    weights take, is held to the modules' bits with adapters in test_cpu_decode.py: its int8
    activations make whole outputs move with any change of summation order, batching's too.)"""
    engine = with_adapters(engine_factory(num_blocks=512), adapter_dirs[0])
    names = [None, "all", "qv"] * 2
    alone = [
        generate(engine, [ids], [name])[0] for ids, name in zip(prompt_ids, names, strict=True)
    ]
    assert generate(engine, prompt_ids, names) == alone
    assert alone[1] != generate(engine, [prompt_ids[1]], [None])[0]
    assert_all_blocks_free(engine)


def test_each_adapter_has_its_own_prefix_cache(engine_factory, adapter_dirs):
    engine = with_adapters(engine_factory(num_blocks=512), adapter_dirs[0])
    text = " ".join(f"Item {i}: a line no other test of this engine sends." for i in range(12))
    long_prompt = engine.tokenizer.encode(text)  # no chat template: its start is cached
    assert len(long_prompt) > 2 * engine.block_size
    base_first = generate(engine, [long_prompt], [None])[0]
    hits = engine.blocks.prefix_hits
    adapted = generate(engine, [long_prompt], ["all"])[0]
    assert engine.blocks.prefix_hits == hits, "the adapter reused the base model's K/V"
    again = generate(engine, [long_prompt], ["all"])[0]
    assert engine.blocks.prefix_hits > hits, "the adapter's own prefix was not reused"
    assert again == adapted
    assert generate(engine, [long_prompt], [None])[0] == base_first
    assert_all_blocks_free(engine)


def test_speculation_keeps_the_adapters_output(engine_factory, adapter_dirs, prompt_ids):
    plain = with_adapters(engine_factory(num_blocks=512), adapter_dirs[0])
    names = ["all", "qv", None]
    expected = generate(plain, prompt_ids[:3], names)
    spec = with_adapters(
        engine_factory(num_blocks=512, speculative_tokens=4, speculative_row_cost=0.0),
        adapter_dirs[0],
    )
    accepted = spec.metrics.spec_accepted._value.get()
    assert generate(spec, prompt_ids[:3], names) == expected
    assert spec.metrics.spec_accepted._value.get() > accepted, "no draft was accepted"
    assert_all_blocks_free(spec)


def test_unloading_keeps_running_requests(engine_factory, adapter_dirs, prompt_ids):
    dirs = adapter_dirs[0]
    engine = engine_factory(num_blocks=512)
    adapters = engine.runner.adapters
    adapters.add("transient", dirs["all"])
    expected = generate(engine, prompt_ids[:1], ["transient"])
    request = GenerationRequest(
        "t", prompt_ids[0], greedy(MAX_NEW, min_tokens=MAX_NEW), adapter=adapters.get("transient")
    )
    engine.add_request(request)
    tokens = [t for o in engine.step() for t in o.token_ids]  # the prefill and a first token
    adapters.remove("transient")
    assert adapters.get("transient") is None
    while engine.has_work():
        tokens += [t for o in engine.step() for t in o.token_ids]
    assert tokens == expected[0]
    with pytest.raises(AdapterError, match="no adapter named"):
        adapters.remove("transient")
    assert_all_blocks_free(engine)


def test_bad_adapters_are_refused_with_the_reason(engine_factory, adapter_dirs, tmp_path):
    config = engine_factory(num_blocks=512).model_config
    good = adapter_dirs[1]["all"]
    with pytest.raises(AdapterError, match=r"no adapter_config\.json"):
        load_adapter("x", str(tmp_path), config)
    wrong = {k: v[:, :-1].contiguous() if "lora_A" in k else v for k, v in good.items()}
    path = write_adapter(tmp_path / "shape", wrong, 8, 16, PROJECTIONS)
    with pytest.raises(AdapterError, match=r"this model needs \(8, 576\)"):
        load_adapter("x", path, config)
    path = write_adapter(tmp_path / "bias", good, 8, 16, PROJECTIONS, bias="all")
    with pytest.raises(AdapterError, match="bias"):
        load_adapter("x", path, config)
    one_sided = {k: v for k, v in good.items() if "layers.3.mlp.down_proj.lora_B" not in k}
    path = write_adapter(tmp_path / "half", one_sided, 8, 16, PROJECTIONS)
    with pytest.raises(AdapterError, match="layer 3 down_proj lacks lora_A or lora_B"):
        load_adapter("x", path, config)
    head = {"base_model.model.lm_head.lora_A.weight": torch.zeros(8, 576)}
    path = write_adapter(tmp_path / "head", head, 8, 16, ["lm_head"])
    with pytest.raises(AdapterError, match="lm_head"):
        load_adapter("x", path, config)
    path = write_adapter(tmp_path / "rank", good, "8", 16, PROJECTIONS)
    with pytest.raises(AdapterError, match="r must be a positive integer"):
        load_adapter("x", path, config)
    (tmp_path / "rank" / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(AdapterError, match="not a JSON object"):
        load_adapter("x", path, config)
    path = write_adapter(tmp_path / "torn", good, 8, 16, PROJECTIONS)
    weights = tmp_path / "torn" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(AdapterError, match="not a readable safetensors file"):
        load_adapter("x", path, config)
    path = write_adapter(tmp_path / "dora", good, 8, 16, PROJECTIONS, use_dora=True)
    with pytest.raises(AdapterError, match="DoRA"):
        load_adapter("x", path, config)


def test_at_most_max_loras_adapters(engine_factory, adapter_dirs):
    engine = engine_factory(num_blocks=512, max_loras=1)
    adapters = engine.runner.adapters
    adapters.add("one", adapter_dirs[0]["qv"])
    with pytest.raises(AdapterError, match="already loaded"):
        adapters.add("one", adapter_dirs[0]["qv"])
    for reserved in ("smollm2", ""):  # the base model's name would shadow the adapter
        with pytest.raises(AdapterError, match="cannot be named"):
            adapters.add(reserved, adapter_dirs[0]["qv"])
    with pytest.raises(AdapterError, match=r"max_loras"):
        adapters.add("two", adapter_dirs[0]["qv"])
    adapters.remove("one")
    adapters.add("two", adapter_dirs[0]["qv"])
    adapters.remove("two")


def test_concurrent_loads_of_one_name_keep_one(engine_factory, adapter_dirs):
    """Loads at run time come from the server's threads: of four loads of one name, one wins."""
    from concurrent.futures import ThreadPoolExecutor

    config = engine_factory(num_blocks=512).model_config
    adapters = Adapters(config, torch.device("cpu"), torch.float32, max_loras=2)

    def load(_: int) -> str:
        try:
            adapters.add("same", adapter_dirs[0]["qv"])
            return "loaded"
        except AdapterError as exc:
            return str(exc)

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(load, range(4)))
    assert outcomes.count("loaded") == 1
    assert all("already loaded" in o for o in outcomes if o != "loaded")
    assert adapters.names() == ["same"]
