"""How much of a prompt is source code: the share of its non-blank lines that read as code.

The router's training domains are prose (exam questions, word problems, chat tasks), and the
mean of MiniLM token vectors places code among them: every piece of a Python snippet occurs in
MMLU's computer-science questions, so the embedding's OOD guard gave code prompts full confidence
(bench/RESULTS.md, CRUXEval). What sets code apart is its lines, not its tokens, so the guard
reads them here (router/scorer.py): a line counts as code inside a ``` fence, when it is indented
(other than a list item), or when it carries syntax that prose does not (comparison and compound
operators, an import or include directive, a statement keyword with code punctuation, a block
opened or closed, an assignment to a name). LaTeX, chemical equations and multiple-choice
options do not count.
"""

import re

# Plain substring tests where they do: a regular expression of alternatives costs ~3 us a line
# (~0.15 ms for the 2,000 characters the router reads), and one with `.*` between two parts
# backtracks over a long line; the string tests in `_is_code` cost ~1 us a line.

_LIST_ITEM = re.compile(r"\s+([-*•+]|\d+[.)]|[a-zA-Z][.)])\s")
# lines that are code as they stand (`import os`, `#include <stdio.h>`); possessive quantifiers
# (`++`, `*+`) keep a long line that almost matches from backtracking
_DIRECTIVE = re.compile(
    r"\s*(import\s+[\w.]++(\s+as\s+\w++)?+(\s*,\s*[\w.]++(\s+as\s+\w++)?+)*+\s*;?"  # Python, Java
    r"|from\s+[\w.]++\s+import\s+\S.*"  # Python
    r"|#include\s*[<\"].*|#define\s+\w.*)\s*$"
)
# keywords that also open prose sentences: code only with code punctuation on the line
_DECLARATION = re.compile(
    r"\s*(def|class|assert|return|elif|public|private|static|function|var|let|const|async"
    r"|await|fn|func|package|using)\b"
)
_BLOCK = re.compile(r"\s*(if|for|while|with|try|except|else)\b")
_ASSIGNMENT = re.compile(r"\s*\w+(\.\w+)*\s*=\s*\S")


def _is_code(line: str) -> bool:
    """`line` is not blank."""
    if line[0] in " \t" and not _LIST_ITEM.match(line):
        return True  # indented, and not a list item
    end = line.rstrip()
    last = end[-1]
    if last == "{" or end.lstrip()[0] in "}])":
        return True  # a block opened or closed
    if "=" in line:
        if (
            last == ";"  # a statement
            or "==" in line
            or "!=" in line
            or "+=" in line
            or "-=" in line
            or "*=" in line
            or "=>" in line
            or _ASSIGNMENT.match(line)
        ):
            return True
    elif last == ";" and "(" in line:
        return True  # a call as a statement
    if "&&" in line or "||" in line or "::" in line or "</" in line or "/>" in line or "()" in line:
        return True
    if _DIRECTIVE.match(line):
        return True
    if line.startswith("import ") and (" from '" in line or ' from "' in line):
        return True  # a JavaScript import
    if _DECLARATION.match(line):
        return "(" in line or ":" in line or "=" in line or ";" in line or "{" in line
    return last == ":" and _BLOCK.match(line) is not None


def code_share(text: str) -> float:
    """The share, in [0, 1], of `text`'s non-blank lines that read as code; 0 for no lines."""
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return 0.0
    fenced = False
    code = 0
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            code += 1
        elif fenced or _is_code(line):
            code += 1
    return code / len(lines)
