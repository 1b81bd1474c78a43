"""Held-out prompts for ``specdec demo``, three kinds: write code, edit or repeat given text,
answer a question. None of them is used to tune anything; each is a chat message to an
instruction-tuned model."""

from __future__ import annotations

__all__ = ["PROMPTS"]

_POEM = (
    "The morning fog rolled over the quiet harbor, and the fishing boats waited at their "
    "moorings for the tide. Gulls circled above the pier, calling to one another, while the "
    "old lighthouse keeper climbed the stairs one last time to watch the sun rise over the "
    "gray water."
)

_CODE = """def average(values):
    total = 0
    count = 0
    for value in values:
        total = total + value
        count = count + 1
    if count == 0:
        return 0
    return total / count
"""

_LETTER = (
    "Dear team, thank you for your hard work this quarter. Our sales grew by twelve percent, "
    "and our customers are happier than ever. Next month we will open a new office in Lisbon, "
    "and we will hire five new engineers. Please send me your ideas for the launch event by "
    "Friday. Best regards, Maria"
)

PROMPTS: dict[str, list[str]] = {
    "code": [
        "Write a Python function that returns the n-th Fibonacci number iteratively, with a "
        "docstring.",
        "Write a Python class Stack with push, pop, peek and is_empty methods.",
    ],
    "edit": [
        f"Repeat the following text exactly, word for word:\n\n{_POEM}",
        "Rename the variable `total` to `running_sum` in this code and return the whole "
        f"function:\n\n{_CODE}",
        "Fix the capitalization and return the full text unchanged otherwise:\n\n"
        + _LETTER.lower(),
    ],
    "qa": [
        "What is the capital of France, and what is it famous for?",
        "Explain in a few sentences why the sky is blue.",
    ],
}
