"""Train the complexity classifier, choose its recipe by leave-one-domain-out, evaluate it.

Five domains, each routed between the same two models (Mixtral-8x7B-Instruct weak,
gpt-4-1106-preview strong; router/training/dataset.py): MMLU, GSM8K, MT-Bench, ARC-Challenge,
Winogrande.
- Leave one domain out (LODO): for each domain, a model of the recipe is fitted on all the prompts
  of the other four and scores every prompt of the held-out one. The recipe is chosen on LODO,
  never on in-domain numbers, since that is what predicts prompts from no benchmark (`choose`):
  the best mean APGR among the recipes that route no held-out domain worse than the length rule.
  Every recipe's LODO row is in the report.
- The shipped model is fitted on the train parts of every domain (seeded splits grouped by
  normalised prompt; MT-Bench's 72 questions are all training), calibrated on the validation parts
  (share → threshold), and scored on the test parts (in-domain, secondary).
- Each RouterBench model's quality curve (router/quality.py) is fitted on the LODO scores of
  ARC-Challenge and Winogrande, for the cost-aware choice; the report scores that choice with the
  curves of one domain on the other (router/training/costs.py).
- Feedback from the platform's own traffic (`POST /v1/feedback`) joins the training data with
  `--feedback`, and gives each model rated often enough its own quality curve
  (router/features.py).
"""

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import sklearn
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression

from tokenyard.router.embedding import WordPieces, token_table, tokenizer_json
from tokenyard.router.features import Ratings
from tokenyard.router.samples import Samples
from tokenyard.router.scorer import CompiledScorer
from tokenyard.router.training.costs import cost_quality, fit_curves, own_curves
from tokenyard.router.training.dataset import (
    DOMAINS,
    ROUTERBENCH_FILES,
    Routed,
    data_hash,
    load_domains,
    random_split,
)
from tokenyard.router.training.evaluation import Interval, bootstrap
from tokenyard.router.training.probes import PROBES, load_probe
from tokenyard.router.training.report import write_report

ARTIFACT_DIR = Path(__file__).parents[1] / "artifacts"
CACHE_DIR = Path("var") / "router"
VERSION = "v7"
# the label's margin on [0, 1] quality: a graded domain (MT-Bench's judge) counts a gain of more
# than half a judge point; on correctness it is any gain
GAIN_MARGIN = 0.05
# "weak fails" on graded quality: a judge score under 8 of 10 (on correctness: a wrong answer)
WEAK_PASS = 0.8


@dataclass(frozen=True)
class Recipe:
    # the label: "escalate" (the strong model gains over the weak one) or "weak_fails"
    target: str = "weak_fails"
    c: float = 0.1  # inverse L2 strength of the embedding LR
    dims: int = 32  # principal axes kept of MiniLM's token vectors
    w_length: float = 0.5  # weight of the standardised log length beside the LR's logit

    @property
    def name(self) -> str:
        return f"{self.target} C={self.c:g} dims={self.dims} w_length={self.w_length:g}"


def _recipes() -> tuple[Recipe, ...]:
    # the exploratory LODO runs (bench/RESULTS.md) put the good recipes here: few principal axes
    # (32 beat 64, 128 and all 384), a moderate C, some length (none was worse on MMLU and GSM8K)
    return tuple(
        Recipe(target=t, c=c, dims=32, w_length=w)
        for t in ("escalate", "weak_fails")
        for c in (0.1, 1.0)
        for w in (0.25, 0.5, 1.0)
    )


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    val_frac: float = 0.15
    test_frac: float = 0.25
    bootstrap_resamples: int = 1000
    centroids: int = 64  # k-means centroids of the training embeddings, for the OOD guard
    # the guard: full confidence at or above this quantile of the training prompts' similarity to
    # their nearest centroid, none at or below the lower one; and full confidence up to this
    # quantile of their distance from the mean, none from `norm_none_factor` times the higher one
    sim_full_quantile: float = 0.10
    sim_none_quantile: float = 0.001
    norm_full_quantile: float = 0.99
    norm_none_quantile: float = 0.999
    norm_none_factor: float = 1.5
    # and full confidence up to this share of a prompt's lines being code, none from the higher
    # one (router/code_lines.py: every CRUXEval prompt is at 0.5 or more; fewer than 1% of the
    # training prompts are over 0.25)
    code_full: float = 0.25
    code_none: float = 0.5
    recipes: tuple[Recipe, ...] = field(default_factory=_recipes)


def labels(s: Samples, target: str) -> np.ndarray:
    if target == "escalate":
        return s.strong - s.weak > GAIN_MARGIN
    if target == "weak_fails":
        return s.weak < WEAK_PASS
    raise ValueError(f"unknown target {target!r}")


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def fit(
    recipe: Recipe, s: Samples, table: np.ndarray, pieces: WordPieces, config: TrainConfig
) -> CompiledScorer:
    pca = PCA(recipe.dims, random_state=config.seed).fit(s.raw)
    axes = pca.components_
    projected = (s.raw - pca.mean_) @ axes.T
    norms = np.linalg.norm(projected, axis=1)
    e = _normalise(projected)
    # within each domain: the LR learns what makes a prompt harder than its domain's others, not
    # which training domain is hardest (a held-out domain is ranked within itself); each domain
    # weighs the same, so MMLU's 14,000 prompts do not make it the only one learnt
    within = e.copy()
    weight = np.empty(len(s))
    for d in np.unique(s.domain):
        mask = s.domain == d
        within[mask] -= e[mask].mean(axis=0)
        weight[mask] = 1.0 / mask.sum()
    lr = LogisticRegression(C=recipe.c, max_iter=3000, random_state=config.seed)
    lr.fit(within, labels(s, recipe.target), sample_weight=weight / weight.mean())
    coef = lr.coef_[0]
    logits = e @ coef
    kmeans = KMeans(config.centroids, n_init=1, random_state=config.seed).fit(e)
    centroids = _normalise(kmeans.cluster_centers_)
    sims = (e @ centroids.T).max(axis=1)
    return CompiledScorer(
        pieces=pieces,
        table=(table @ axes.T).astype(np.float32),
        center=pca.mean_ @ axes.T,
        coef=coef,
        logit_mean=float(logits.mean()),
        logit_std=float(logits.std()),
        length_mean=float(s.log_chars.mean()),
        length_std=float(s.log_chars.std()),
        w_length=recipe.w_length,
        centroids=centroids,
        sim_none=float(np.quantile(sims, config.sim_none_quantile)),
        sim_full=float(np.quantile(sims, config.sim_full_quantile)),
        norm_full=float(np.quantile(norms, config.norm_full_quantile)),
        norm_none=config.norm_none_factor * float(np.quantile(norms, config.norm_none_quantile)),
        axes=axes,
        raw_mean=pca.mean_,
        code_full=config.code_full,
        code_none=config.code_none,
    )


def embed_raw(rows: list[Routed], table: np.ndarray, pieces: WordPieces) -> np.ndarray:
    out = np.zeros((len(rows), table.shape[1]))
    for i, r in enumerate(rows):
        ids = pieces.ids(r.prompt)
        if ids:
            out[i] = table[ids].mean(axis=0, dtype=np.float64)
    return out


def _cached(path: Path, make: Callable[[], np.ndarray]) -> np.ndarray:
    """Embeddings are a pure function of the model package and the data: computed once per
    machine under var/ (ignored by git), about two minutes otherwise."""
    if path.exists():
        return np.load(path)
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, value)
    return value


def samples(rows: list[Routed], raw: np.ndarray) -> Samples:
    return Samples(
        raw=raw,
        log_chars=np.log1p([len(r.prompt) for r in rows]),
        weak=np.array([r.weak for r in rows]),
        strong=np.array([r.strong for r in rows]),
        domain=np.array([r.domain for r in rows]),
    )


def length_scores(prompts: list[str]) -> np.ndarray:
    return np.array([len(p) for p in prompts], dtype=float)


def evaluate(
    scores: np.ndarray, rows: list[Routed], config: TrainConfig, salt: int
) -> dict[str, Any]:
    """The classifier next to random routing and the length rule, on the same prompts."""
    prompts = [r.prompt for r in rows]
    weak, strong = np.array([r.weak for r in rows]), np.array([r.strong for r in rows])
    routers = {
        "classifier": scores,
        "length": length_scores(prompts),
        "random": np.random.default_rng(config.seed + salt).random(len(prompts)),
    }
    absolute, paired = bootstrap(
        routers, weak, strong, config.bootstrap_resamples, config.seed + salt, baseline="length"
    )
    return {
        "n": len(prompts),
        "weak_quality": float(weak.mean()),
        "strong_quality": float(strong.mean()),
        "routers": {k: _intervals(v) for k, v in absolute.items()},
        "minus_length": {k: _intervals(v) for k, v in paired.items()},
    }


def _intervals(metrics: dict[str, Interval]) -> dict[str, dict[str, float | None]]:
    # JSON has no NaN: an undefined metric is null
    return {
        k: {f: None if math.isnan(x) else x for f, x in asdict(v).items()}
        for k, v in metrics.items()
    }


def lodo_scores(
    recipe: Recipe,
    domains: dict[str, list[Routed]],
    every: dict[str, Samples],
    extra: Samples | None,
    table: np.ndarray,
    pieces: WordPieces,
    config: TrainConfig,
) -> dict[str, np.ndarray]:
    """Each domain's prompts scored by a model fitted on the other domains (and the feedback)."""
    out = {}
    for held in DOMAINS:
        train = [every[d] for d in DOMAINS if d != held] + ([extra] if extra is not None else [])
        scorer = fit(recipe, Samples.join(train), table, pieces, config)
        out[held] = scorer.scores([r.prompt for r in domains[held]])
    return out


def mixed_sample(domains: dict[str, list[Routed]], seed: int) -> dict[str, np.ndarray]:
    """Of each domain graded on correctness (MT-Bench's judge scores are another scale), as many
    prompts as the smallest has, drawn at random: a mixed set where no domain outweighs the
    others."""
    graded = [d for d in DOMAINS if d != "mt_bench"]
    n = min(len(domains[d]) for d in graded)
    rng = np.random.default_rng(seed)
    return {d: np.sort(rng.choice(len(domains[d]), n, replace=False)) for d in graded}


def evaluate_mixed(
    lodo: dict[str, np.ndarray], domains: dict[str, list[Routed]], config: TrainConfig
) -> dict[str, Any]:
    """The held-out domains routed as one mixed set, as traffic of many kinds is (and a mixed
    benchmark like RouterArena): each prompt scored by the model that never saw its domain, so
    the ranking across domains counts as well as the ranking within each."""
    sample = mixed_sample(domains, config.seed)
    rows = [domains[d][i] for d, idx in sample.items() for i in idx]
    scores = np.concatenate([lodo[d][idx] for d, idx in sample.items()])
    return evaluate(scores, rows, config, salt=len(DOMAINS) * 2) | {"domains": list(sample)}


def evaluate_unseen(
    scorer: CompiledScorer, rows: list[Routed], config: TrainConfig, salt: int
) -> dict[str, Any]:
    """A domain no model trained on, routed by `scorer`, with the OOD guard's confidence."""
    routed = [scorer.route_score(r.prompt) for r in rows]
    confidence = np.quantile([s.confidence for s in routed], [0.1, 0.5, 0.9])
    scores = np.array([s.score for s in routed])
    return evaluate(scores, rows, config, salt) | {"confidence": confidence.tolist()}


def selection_row(recipe: Recipe, evals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A recipe's held-out APGR per domain, their mean, and how it stands against the length rule:
    its worst domain's paired difference, and whether no domain's interval lies wholly below 0."""
    apgr = {d: e["routers"]["classifier"]["apgr"]["value"] for d, e in evals.items()}
    gaps = [e["minus_length"]["classifier"]["apgr"] for e in evals.values()]
    return {
        "recipe": recipe.name,
        "apgr": apgr,
        "mean": float(np.mean(list(apgr.values()))),
        "worst_vs_length": min(g["value"] for g in gaps),
        "never_below_length": all(g["high"] is None or g["high"] >= 0 for g in gaps),
    }


def choose(selection: list[dict[str, Any]]) -> int:
    """The recipe that ships: the best mean held-out APGR among those that route no held-out domain
    worse than the length rule (the prior the OOD guard falls back to), so that a domain no one
    trained on is not made worse by the classifier; where none qualifies, the one whose worst domain
    loses least to the length rule."""
    safe = [i for i, row in enumerate(selection) if row["never_below_length"]]
    if safe:
        return max(safe, key=lambda i: selection[i]["mean"])
    return max(range(len(selection)), key=lambda i: selection[i]["worst_vs_length"])


def threshold_curve(val_scores: np.ndarray, points: int = 101) -> dict[str, list[float]]:
    """Strong share → threshold: routing `score >= threshold` sends about `share` of traffic
    like the validation prompts to the strong model. Thresholds fall as the share rises."""
    shares = np.linspace(0.0, 1.0, points)
    thresholds = np.quantile(val_scores, 1.0 - shares)
    # share 0 must route nothing: a threshold just above the highest score seen
    thresholds[0] = np.nextafter(thresholds[0], np.inf)
    return {"strong_share": shares.tolist(), "threshold": thresholds.tolist()}


def prompts_hash(rows: Sequence[Routed]) -> str:
    return hashlib.sha256("\x00".join(r.prompt for r in rows).encode()).hexdigest()


def train(
    config: TrainConfig,
    out_dir: Path = ARTIFACT_DIR,
    ratings: Ratings | None = None,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """`ratings`: the platform's rated requests (`--feedback`): the weak class's join the
    training data, and a model rated often enough gets its own quality curve."""
    started = time.time()
    feedback = ratings.samples() if ratings is not None else None
    domains = load_domains()
    pieces = WordPieces(tokenizer_json())
    table = _cached(CACHE_DIR / "minilm-token-table.npy", token_table)
    every = {}
    # the cache key: the prompts, and how the tokenizer splits a probe text
    probe = str(pieces.ids("Which of these is NOT a prime? Naïve café, 3½ × 10⁻³.")).encode()
    for d in DOMAINS:
        key = hashlib.sha256(prompts_hash(domains[d]).encode() + probe).hexdigest()[:16]
        raw = _cached(
            CACHE_DIR / f"raw-{d}-{key}.npy", lambda d=d: embed_raw(domains[d], table, pieces)
        )
        every[d] = samples(domains[d], raw)
    log(f"embedded {sum(map(len, every.values()))} prompts ({time.time() - started:.0f} s)")

    # every recipe scored on every held-out domain, beside the length rule on the same prompts
    selection, runs = [], []
    for recipe in config.recipes:
        scores = lodo_scores(recipe, domains, every, feedback, table, pieces, config)
        evals = {d: evaluate(scores[d], domains[d], config, salt) for salt, d in enumerate(DOMAINS)}
        selection.append(selection_row(recipe, evals))
        runs.append((scores, evals))
        log(f"LODO {selection[-1]}")
    best_i = choose(selection)
    best = config.recipes[best_i]
    log(f"chosen: {best.name}")
    lodo, lodo_evals = runs[best_i]
    evaluations: dict[str, Any] = {"lodo": lodo_evals, "in_domain": {}}
    evaluations["mixed"] = evaluate_mixed(lodo, domains, config)

    # the shipped model: train parts of every domain (MT-Bench whole), plus the feedback
    splits = {
        d: random_split(domains[d], config.seed, config.val_frac, config.test_frac)
        for d in DOMAINS
        if d != "mt_bench"
    }
    train_parts = [every["mt_bench"]] + [every[d].take(splits[d].train) for d in splits]
    shipped = fit(
        best, Samples.join(train_parts + ([feedback] if feedback else [])), table, pieces, config
    )
    val_prompts = [domains[d][i].prompt for d in splits for i in splits[d].val]
    for salt, d in enumerate(splits, start=len(DOMAINS)):
        test = [domains[d][i] for i in splits[d].test]
        evaluations["in_domain"][d] = evaluate(
            shipped.scores([r.prompt for r in test]), test, config, salt
        )
    evaluations["unseen"] = {
        name: evaluate_unseen(shipped, load_probe(name), config, salt)
        for salt, name in enumerate(PROBES, start=len(DOMAINS) + len(splits))
    }
    # cost-aware choice: curves fitted on leave-one-domain-out scores, the kind the shipped model
    # gives a prompt from no training domain
    priced = {d: domains[d] for d in ROUTERBENCH_FILES}
    evaluations["cost_quality"] = cost_quality(lodo, priced)
    rows = [r for d in priced for r in priced[d]]
    curves = fit_curves(np.concatenate([lodo[d] for d in priced]), rows)
    # the deployment's own models, by catalog id, read against the shipped model's score
    own = own_curves(ratings, shipped) if ratings is not None else {}

    metadata = {
        "version": VERSION,
        "created_unix": int(time.time()),
        "sklearn_version": sklearn.__version__,
        "data_sha256": data_hash(),
        "config": asdict(config),
        "chosen": asdict(best) | {"name": best.name},
        "selection": selection,
        "feedback_rows": 0 if feedback is None else len(feedback),
        "feedback_curves": sorted(own),
        "threshold_curve": threshold_curve(shipped.scores(val_prompts)),
        "quality_curves": {m: asdict(c) for m, c in (curves | own).items()},
        "test_prompts_sha256": {
            d: prompts_hash([domains[d][i] for i in splits[d].test]) for d in splits
        },
        "train_seconds": round(time.time() - started, 1),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"complexity-{VERSION}"
    joblib.dump(shipped, stem.with_suffix(".joblib"), compress=3)
    stem.with_suffix(".json").write_text(json.dumps(metadata, indent=1) + "\n")
    report = {"version": VERSION, "chosen": best.name, "evaluations": evaluations}
    write_report(report, metadata, out_dir / f"complexity-{VERSION}-report")
    return report
