"""Trained artifacts as shipped: a joblib file of plain arrays beside its JSON metadata."""

import json
import warnings
from pathlib import Path
from typing import Any

import joblib
import sklearn


def load_artifact(path: Path | str, retrain: str) -> tuple[Any, dict[str, Any]]:
    """(the stored object, its metadata); warns, naming the `retrain` command, when another
    scikit-learn trained it."""
    path = Path(path)
    metadata = json.loads(path.with_suffix(".json").read_text())
    trained = metadata.get("sklearn_version")
    if trained != sklearn.__version__:
        # only plain arrays are stored: the version matters to retraining, not to scoring
        warnings.warn(
            f"{path.name} was trained with scikit-learn {trained}, this is "
            f"{sklearn.__version__}; retrain with `{retrain}`",
            stacklevel=3,
        )
    return joblib.load(path), metadata
