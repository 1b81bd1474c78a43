"""Held-out prompts for ``specdec demo``, three kinds: write code, edit or repeat given text,
answer a question. None of them is used to tune anything; each is a chat message to an
instruction-tuned model.

``CORPUS_PROMPTS`` are more of the same kinds, none of them in ``PROMPTS``: what a server has
answered before the measured requests arrive. A benchmark runs them first, unmeasured, to
warm what a drafter learns across requests (a suffix drafter's corpus of finished
outputs), as it is in a server that has been up for a while."""

from __future__ import annotations

__all__ = ["CORPUS_PROMPTS", "PROMPTS"]

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

CORPUS_PROMPTS: dict[str, list[str]] = {
    "code": [
        "Write a Python function that checks whether a string is a palindrome, with a docstring.",
        "Write a Python function that returns the factorial of n recursively, with a docstring.",
        "Write a Python class Queue with enqueue, dequeue, peek and is_empty methods.",
        "Write a Python function that merges two sorted lists into one sorted list.",
        "Write a Python function that counts the vowels in a string.",
        "Write a Python class BankAccount with deposit, withdraw and get_balance methods.",
        "Write a Python function that returns the largest element of a list without using max.",
        "Write a Python function that reverses a linked list, with a docstring.",
        "Write a Python function that checks whether a number is prime.",
        "Write a Python class Rectangle with area and perimeter methods.",
        "Write a Python function that computes the greatest common divisor of two numbers.",
        "Write a Python function that removes duplicates from a list while keeping the order.",
        "Write a Python function that performs binary search on a sorted list, with a docstring.",
        "Write a Python class LinkedList with append, remove and find methods.",
        "Write a Python function that converts a temperature from Celsius to Fahrenheit.",
        "Write a Python function that returns the sum of the digits of an integer.",
    ],
    "edit": [
        "Repeat the following text exactly, word for word:\n\nThe train left the station at "
        "dawn, carrying farmers to the market and children to the school in the valley. By noon "
        "the fields were bright with sun, and the river ran slow and warm beside the tracks.",
        "Rename the variable `items` to `entries` in this code and return the whole function:"
        "\n\ndef count_items(items):\n    n = 0\n    for item in items:\n        n = n + 1\n"
        "    return n\n",
        "Fix the capitalization and return the full text unchanged otherwise:\n\nhello "
        "everyone, the meeting on monday is moved to tuesday at ten. please bring your reports "
        "and the budget for march. thanks, john",
        "Repeat the following text exactly, word for word:\n\nA small cat slept on the warm "
        "windowsill while the rain fell on the garden outside. In the kitchen, the kettle began "
        "to sing, and the smell of fresh bread filled the old house.",
        "Rename the function `calc` to `compute_total` in this code and return the whole code:"
        "\n\ndef calc(prices):\n    result = 0\n    for p in prices:\n        result += p\n"
        "    return result\n\nprint(calc([1, 2, 3]))\n",
        "Fix the capitalization and return the full text unchanged otherwise:\n\ndear "
        "customers, our store in berlin will close early on friday for the holiday. we will "
        "open again on monday at nine. thank you, the team",
        "Repeat the following text exactly, word for word:\n\nThe mountain path was steep and "
        "narrow, and the hikers stopped often to catch their breath. At the top they found a "
        "small lake, clear and cold, with snow still lying on its northern shore.",
        "Rename the variable `x` to `width` in this code and return the whole function:\n\n"
        "def area(x, height):\n    if x < 0 or height < 0:\n        return 0\n"
        "    return x * height\n",
    ],
    "qa": [
        "What is the capital of Italy, and what is it famous for?",
        "Explain in a few sentences why leaves change color in autumn.",
        "What is the capital of Japan, and what is it known for?",
        "Explain in a few sentences how a rainbow forms.",
        "What is photosynthesis? Answer in a few sentences.",
        "Explain in a few sentences why the ocean is salty.",
        "What is the capital of Spain, and what is it famous for?",
        "Explain in a few sentences what causes the seasons.",
        "Why do we have tides? Explain briefly.",
        "What is the capital of Germany, and what is it known for?",
        "Explain in a few sentences how vaccines work.",
        "What is gravity? Answer in a few sentences.",
        "Explain in a few sentences why the moon has phases.",
        "What is the capital of Egypt, and what is it famous for?",
        "Explain in a few sentences how airplanes fly.",
        "What makes thunder? Explain briefly.",
    ],
}
