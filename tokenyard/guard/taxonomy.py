"""The safety layer's taxonomy: the categories it scores, by OpenAI's moderation names, and the
input-only jailbreak class. What serving needs of the training data's labels, without loading the
data code (guard/training/dataset.py)."""

# OpenAI's moderation categories the data supports, and the input-only jailbreak/injection class
CATEGORIES = (
    "sexual",
    "sexual/minors",
    "hate",
    "hate/threatening",
    "harassment",
    "harassment/threatening",
    "self-harm",
    "violence",
    "illicit",
    "illicit/violent",
)
JAILBREAK = "jailbreak"
# any category at all: the gate every category passes through (a category fires only where this
# head does too), and the one score of "harmful or not"
HARMFUL = "harmful"
HEADS = (*CATEGORIES, JAILBREAK, HARMFUL)
# OpenAI's full list (the /v1/moderations answer names every one); those not in CATEGORIES have no
# training data of their own here and are answered from their parent (docs/guard.md)
OPENAI_CATEGORIES = (
    "sexual",
    "sexual/minors",
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "violence",
    "violence/graphic",
)
PARENT = {"self-harm/intent": "self-harm", "self-harm/instructions": "self-harm",
          "violence/graphic": "violence"}  # fmt: skip
