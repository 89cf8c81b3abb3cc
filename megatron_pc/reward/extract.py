"""Final-answer extraction from a model response.

The rule, in order:
1. the content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced;
2. otherwise the LAST number in the text: optional minus sign, digits, optional decimal part
   (``-12``, ``3.5``; thousands separators are not joined: ``1,000`` gives ``000``);
3. otherwise None.

If the last ``\\boxed{`` is never closed (a truncated response), rule 1 does not apply and rule 2
does. Only the last box is examined so that extraction stays linear in the response length
even for adversarial inputs of many unclosed boxes.
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "last_boxed", "last_number"]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}``, or None if absent or unclosed."""
    last = None
    for last in _BOX_RE.finditer(text):
        pass
    if last is None:
        return None
    depth = 1
    start = last.end()
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (see module docstring), or None."""
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    return None if last is None else last.group(0)


def extract_answer(text: str) -> str | None:
    """The final answer of a response: last boxed content, else last number, else None."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else last_number(text)
