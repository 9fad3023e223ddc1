"""Domains no router trains on, routed in the training report by the shipped model: how it and
its OOD guard treat a new kind of prompt. CRUXEval (Python output prediction: code), with
Mixtral-8x7B-Instruct as the weak model and gpt-4-turbo-2024-04-09 as the strong one, from
ZeroEval's published greedy outputs (source, licence and derivation: router/data/README.md).

The shipped file holds what this module derives from ZeroEval's result files (`derive_crux`):
the question as a user would send it (without ZeroEval's instruction to answer in JSON) and
whether each model's answer equals the expected output. Rebuild it from a ZeroEval checkout with
`python -m tokenyard.router.training.probes PATH/TO/ZeroEval`.
"""

import gzip
import json
import sys
from pathlib import Path

from tokenyard.router.training.dataset import Routed

PROBE_DIR = Path(__file__).parents[1] / "data" / "zeroeval"
PROBES = ("crux",)
CRUX_WEAK = "Mixtral-8x7B-Instruct-v0.1"
CRUX_STRONG = "gpt-4-turbo-2024-04-09"


def _answer(output: str) -> str | None:
    """The `answer` of the first JSON object in a model's output, as text; None if there is
    none (the model ignored the format, or its JSON does not parse)."""
    start = output.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(output[start:])
    except json.JSONDecodeError:
        return None
    return str(value.get("answer")) if isinstance(value, dict) else None


def _literal(text: str) -> str:
    # a Python literal compared without its spacing or its quotes' style, and without one pair
    # of outer quotes: models write 'abc' where the reference holds "'abc'", or the reverse
    return "".join(text.split()).strip("'\"").replace('"', "'")


def _question(item: dict) -> str:
    # ZeroEval appends its answer-format instruction after "## Instruction"
    asked = item["chat_history"][0].split("## Instruction")[0]
    return asked.replace("## Question:", "").strip()


def _correct(item: dict) -> float:
    answer = _answer(item["output"][0] if item["output"] else "")
    return float(answer is not None and _literal(answer) == _literal(item["answer"]))


def derive_crux(result_dirs: Path) -> list[dict]:
    """Rows {prompt, weak, strong} from ZeroEval's `result_dirs`."""
    weak, strong = (
        {x["id"]: x for x in json.loads((result_dirs / "crux" / f"{m}.json").read_text())}
        for m in (CRUX_WEAK, CRUX_STRONG)
    )
    return [
        {"prompt": _question(item), "weak": _correct(item), "strong": _correct(strong[i])}
        for i, item in weak.items()
        if i in strong
    ]


def load_probe(name: str, data_dir: Path = PROBE_DIR) -> list[Routed]:
    with gzip.open(data_dir / f"{name}.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    return [Routed(r["prompt"], name, name, r["weak"], r["strong"]) for r in rows]


if __name__ == "__main__":
    rows = derive_crux(Path(sys.argv[1]) / "result_dirs")
    PROBE_DIR.mkdir(parents=True, exist_ok=True)
    # mtime 0: the same rows give the same bytes
    with gzip.GzipFile(PROBE_DIR / "crux.jsonl.gz", "wb", compresslevel=9, mtime=0) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    print(f"{len(rows)} rows")
