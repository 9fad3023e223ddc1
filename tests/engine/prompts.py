"""Prompts of varied lengths for the comparison with transformers."""

TOPICS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain photosynthesis to a ten-year-old.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What does a CPU cache do?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How many legs does a spider have?",
    "Write a Python function that reverses a string.",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "Name the planets of the solar system in order.",
    "Describe the water cycle.",
    "What is the difference between weather and climate?",
    "Suggest a name for a pet turtle.",
    "Explain what a linked list is.",
    "Who wrote Pride and Prejudice?",
    "What are the primary colours?",
    "Tell me a fun fact about octopuses.",
    "How do vaccines work?",
    "What is 17 multiplied by 23?",
]

FILLER = (
    "Here is some background you may use. The history of science is full of slow, careful "
    "observation: people measured the stars, the tides, the growth of plants and the behaviour of "
    "animals, wrote down what they saw, and argued about what it meant. "
)


def chat_prompts() -> list[list[dict]]:
    """Short and long user turns (the long ones carry several hundred tokens of context).

    The question comes first, so that only the system prompt is shared between them.
    """
    prompts = []
    for i, topic in enumerate(TOPICS):
        context = FILLER * (i % 5) * 2  # 0 to ~450 tokens of context
        prompts.append([{"role": "user", "content": f"{topic} {context}".strip()}])
    return prompts


SYSTEM = "You are a meticulous assistant. " + FILLER * 3
