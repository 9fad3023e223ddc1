"""Which lines of a prompt read as code (the router's OOD guard reads the share)."""

import pytest

from tokenyard.router.code_lines import code_share

PYTHON = """Complete the assertion with the function's output.

def f(nums):
    out = []
    for n in nums:
        out.append((nums.count(n), n))
    return sorted(out)
assert f([1, 1, 3]) == ??"""

FENCED = """Why does this fail?
```
let x = { "one": 1 }
x.map(z => z + 1)
```
TypeError: not a function"""

C_BLOCK = """Which value does num1 hold afterwards?
int num1 = value1, num2 = value2;
while (num1 > num2) {
num1--;
}"""

PROSE = [
    "",
    "   \n\n",
    "If x = 3 and y = 4, what is x + y?",
    "Let f be a function from R to R. For which of the following is f continuous?",
    "Write a short poem about the sea.\nIt should rhyme.\nKeep it under 10 lines.",
    "What is $$\\frac{-18}{-6}?$$\nA. \\frac{7}{15}\nB. \\frac{15}{7}\nAnswer:",
    "Which equation is balanced?\nA) CaCO_{3} -> CaO + CO_{2}\nB) 2H_{2} + O_{2} -> 2H_{2}O",
    "Plan my week:\n  - Monday: gym\n  - Tuesday: groceries\n  1. call mom\n  2) pay rent",
    "For each item in the list, tell me its colour: apple, banana, plum.",
    "return the answer as a list\nusing plain words",
]


@pytest.mark.parametrize("text", PROSE)
def test_prose_math_and_lists_are_not_code(text: str) -> None:
    assert code_share(text) == 0.0


@pytest.mark.parametrize("text", [PYTHON, FENCED, C_BLOCK])
def test_code_is_most_of_a_snippet(text: str) -> None:
    assert code_share(text) >= 0.5


def test_directives_are_code_without_punctuation() -> None:
    assert code_share("import os\nfrom typing import List\n#include <stdio.h>") == 1.0
    # the same words opening prose sentences are not
    assert code_share("Import duties rose.\nimport the data first, then clean it") == 0.0


def test_the_share_counts_lines() -> None:
    text = "Explain this line, please.\nIt is from our build script.\nresult = compute(a, b)"
    assert code_share(text) == pytest.approx(1 / 3)
    # a fence's lines are code whatever they hold, the fences included
    assert code_share("Read this:\n```\nplain words here\n```") == pytest.approx(3 / 4)
