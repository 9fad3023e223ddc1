"""RouteLLM's per-prompt weak/strong outcomes (router/data/routellm), decontaminated and split.

Every split keeps identical prompts (after whitespace/case normalisation) together, so a test
prompt can never reach training through a duplicate, and drops the prompts RouteLLM lists as
contaminated, exactly as RouteLLM's own evaluation does.
"""

import ast
import csv
import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).parents[1] / "data" / "routellm"
WEAK_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG_MODEL = "gpt-4-1106-preview"


@dataclass(frozen=True)
class Example:
    prompt: str
    benchmark: str  # "mmlu" or "gsm8k"
    subject: str  # the MMLU subject, or the benchmark name for GSM8K
    weak_correct: bool
    strong_correct: bool

    @property
    def weak_fails(self) -> bool:
        return not self.weak_correct


@dataclass(frozen=True)
class MTBenchQuestion:
    question_id: int
    category: str
    first_turn: str
    # mean GPT-4 judge score over both turns, as RouteLLM scores a routed conversation
    weak_score: float
    strong_score: float


@dataclass(frozen=True)
class Splits:
    """Index arrays into the example list; test sets never share a normalised prompt with train."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def _read_text(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        return f.read()


def _contaminated(benchmark: str, data_dir: Path) -> set[str]:
    text = _read_text(data_dir / benchmark / "contaminated_prompts.jsonl.gz")
    return {json.loads(line)["eval_prompt"] for line in text.splitlines() if line.strip()}


def _csv_rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_read_text(path))))


def load_mmlu(data_dir: Path = DATA_DIR) -> list[Example]:
    drop = _contaminated("mmlu", data_dir)
    examples = []
    for path in sorted((data_dir / "mmlu" / "responses").glob("mmlu_*.csv.gz")):
        subject = path.name.removeprefix("mmlu_").removesuffix(".csv.gz")
        for row in _csv_rows(path):
            if row["prompt"] in drop:
                continue
            examples.append(
                Example(
                    prompt=row["prompt"],
                    benchmark="mmlu",
                    subject=subject,
                    weak_correct=row[WEAK_MODEL] == "True",
                    strong_correct=row[STRONG_MODEL] == "True",
                )
            )
    return examples


def load_gsm8k(data_dir: Path = DATA_DIR) -> list[Example]:
    drop = _contaminated("gsm8k", data_dir)
    return [
        Example(
            prompt=row["prompt"],
            benchmark="gsm8k",
            subject="gsm8k",
            weak_correct=row[WEAK_MODEL] == "True",
            strong_correct=row[STRONG_MODEL] == "True",
        )
        for row in _csv_rows(data_dir / "gsm8k" / "gsm8k_responses.csv.gz")
        if row["prompt"] not in drop
    ]


def load_mt_bench(data_dir: Path = DATA_DIR) -> list[MTBenchQuestion]:
    drop = _contaminated("mt_bench", data_dir)
    questions = [
        json.loads(line)
        for line in _read_text(data_dir / "mt_bench" / "question.jsonl.gz").splitlines()
    ]
    scores: dict[tuple[int, str], list[float]] = {}
    for line in _read_text(data_dir / "mt_bench" / "judgements.jsonl.gz").splitlines():
        j = json.loads(line)
        scores.setdefault((j["question_id"], j["model"]), []).append(float(j["score"]))
    return [
        MTBenchQuestion(
            question_id=q["question_id"],
            category=q["category"],
            first_turn=q["turns"][0],
            weak_score=float(np.mean(scores[(q["question_id"], WEAK_MODEL)])),
            strong_score=float(np.mean(scores[(q["question_id"], STRONG_MODEL)])),
        )
        for q in questions
        # RouteLLM drops a question when either of its turns is contaminated
        if not any(turn in drop for turn in q["turns"])
    ]


def normalise(prompt: str) -> str:
    return re.sub(r"\s+", " ", prompt).strip().lower()


def _group_ids(examples: list[Example]) -> np.ndarray:
    ids: dict[str, int] = {}
    return np.array([ids.setdefault(normalise(e.prompt), len(ids)) for e in examples])


def random_split(examples: list[Example], seed: int, val_frac: float, test_frac: float) -> Splits:
    """Seeded split by prompt group: duplicates of a test prompt are all in test."""
    groups = _group_ids(examples)
    unique = np.unique(groups)
    order = np.random.default_rng(seed).permutation(unique)
    n_test = round(len(unique) * test_frac)
    n_val = round(len(unique) * val_frac)
    test_groups = set(order[:n_test].tolist())
    val_groups = set(order[n_test : n_test + n_val].tolist())
    where = np.array(
        [2 if g in test_groups else 1 if g in val_groups else 0 for g in groups.tolist()]
    )
    return Splits(
        train=np.flatnonzero(where == 0),
        val=np.flatnonzero(where == 1),
        test=np.flatnonzero(where == 2),
    )


def subject_folds(examples: list[Example], n_folds: int, seed: int) -> list[np.ndarray]:
    """Seeded assignment of whole MMLU subjects to folds. A prompt can also occur, verbatim, in
    another subject: the caller must keep such duplicates of held-out prompts out of training."""
    subjects = sorted({e.subject for e in examples})
    order = np.random.default_rng(seed).permutation(len(subjects))
    fold_of_subject = {subjects[i]: k % n_folds for k, i in enumerate(order.tolist())}
    folds = np.array([fold_of_subject[e.subject] for e in examples])
    return [np.flatnonzero(folds == k) for k in range(n_folds)]


def data_hash(data_dir: Path = DATA_DIR.parent) -> str:
    """sha256 over the uncompressed data files, so the artifact names exactly what it saw."""
    h = hashlib.sha256()
    for path in sorted(data_dir.rglob("*.gz")):
        h.update(str(path.relative_to(data_dir)).encode())
        h.update(_read_text(path).encode())
    return h.hexdigest()


# --- every routing domain, for leave-one-domain-out training and evaluation ---

ROUTERBENCH_DIR = Path(__file__).parents[1] / "data" / "routerbench"
# RouterBench's names for the model pair RouteLLM's files hold (Mixtral-8x7B-Instruct and
# gpt-4-1106-preview): every domain is routed between the same two models, so "needs the strong
# model" means the same thing in each
ROUTERBENCH_WEAK = "mistralai/mixtral-8x7b-chat"
ROUTERBENCH_STRONG = "gpt-4-1106-preview"
ROUTERBENCH_FILES = {"arc_challenge": "arc_challenge", "winogrande": "winograde"}
DOMAINS = ("mmlu", "gsm8k", "mt_bench", "arc_challenge", "winogrande")


@dataclass(frozen=True)
class Routed:
    """One prompt of any domain with both models' quality on it, in [0, 1] (correctness, or the
    judge's 1-10 score over 10 for MT-Bench), and, where the data has them, every model's
    correctness and call cost (RouterBench's 11 models)."""

    prompt: str
    domain: str
    subject: str
    weak: float
    strong: float
    correct: dict[str, float] | None = None
    cost: dict[str, float] | None = None


def _from_example(e: Example) -> Routed:
    return Routed(e.prompt, e.benchmark, e.subject, float(e.weak_correct), float(e.strong_correct))


def last_question(prompt: str) -> str:
    """RouterBench's prompts are few-shot: the same solved examples, then the question asked after
    the last blank line. The router scores that question (the examples are identical for every
    prompt of the domain, and real traffic does not carry them)."""
    return prompt.rsplit("\n\n", 1)[-1]


def load_routerbench(domain: str, data_dir: Path = ROUTERBENCH_DIR) -> list[Routed]:
    """Both of RouterDC's parts (train and test) of one RouterBench domain; rows with a missing
    score for any model are skipped, as the data's README says."""
    csv.field_size_limit(10**9)
    out = []
    for part in ("train", "test"):
        path = data_dir / f"{ROUTERBENCH_FILES[domain]}_{part}.csv.gz"
        rows = _csv_rows(path)
        models = [k.removesuffix("|total_cost") for k in rows[0] if k.endswith("|total_cost")]
        for row in rows:
            if any(row[m] == "" or row[f"{m}|total_cost"] == "" for m in models):
                continue
            correct = {m: float(row[m]) for m in models}
            out.append(
                Routed(
                    prompt=last_question(ast.literal_eval(row["prompt"])[0]),
                    domain=domain,
                    subject=domain,
                    weak=correct[ROUTERBENCH_WEAK],
                    strong=correct[ROUTERBENCH_STRONG],
                    correct=correct,
                    cost={m: float(row[f"{m}|total_cost"]) for m in models},
                )
            )
    return out


def load_domains(data_dir: Path = DATA_DIR) -> dict[str, list[Routed]]:
    """Every domain's prompts. MT-Bench routes its first turn, scored by the mean judge score of
    both turns over 10, as RouteLLM routes a conversation."""
    mt_bench = [
        Routed(q.first_turn, "mt_bench", q.category, q.weak_score / 10, q.strong_score / 10)
        for q in load_mt_bench(data_dir)
    ]
    return {
        "mmlu": [_from_example(e) for e in load_mmlu(data_dir)],
        "gsm8k": [_from_example(e) for e in load_gsm8k(data_dir)],
        "mt_bench": mt_bench,
        "arc_challenge": load_routerbench("arc_challenge"),
        "winogrande": load_routerbench("winogrande"),
    }
