"""Trained artifacts as shipped: a joblib file (the scorer's own classes over plain arrays, no
scikit-learn object) beside its JSON metadata. Pickle names those classes by module path: moving
one (tokenyard.guard.classifier.Model, tokenyard.router.scorer.CompiledScorer,
tokenyard.router.embedding.WordPieces) means loading the artifact under the old path and dumping
it again, or retraining."""

import json
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import joblib


def load_artifact(path: Path | str, retrain: str) -> tuple[Any, dict[str, Any]]:
    """(the stored object, its metadata); warns, naming the `retrain` command, when another
    scikit-learn trained it."""
    path = Path(path)
    metadata = json.loads(path.with_suffix(".json").read_text())
    trained = metadata.get("sklearn_version")
    # the installed version read from its metadata: importing scikit-learn would cost a serving
    # process ~0.8 s and its memory, for arrays that need none of it
    installed = version("scikit-learn")
    if trained != installed:
        # only plain arrays are stored: the version matters to retraining, not to scoring
        warnings.warn(
            f"{path.name} was trained with scikit-learn {trained}, this is {installed}; "
            f"retrain with `{retrain}`",
            stacklevel=3,
        )
    return joblib.load(path), metadata
