"""JSON from untrusted sources, with a bound on nesting.

Python's ``json`` recurses once per level: a 100,000-deep ``[[[...]]]`` raises
``RecursionError`` (a 500 in the API, a traceback in a command). ``loads`` counts
the depth first, in one pass of a C-speed regular expression, and refuses a
document nested deeper than ``max_depth`` with a ``TooDeep`` (a ``ValueError``)
naming the limit. Shared by the API's parser and anything else reading JSON from
outside (``import_topology`` can use it too)."""

from __future__ import annotations

import json
import re
from typing import Any

DEFAULT_MAX_DEPTH = 64

# A string (escapes included), or one bracket. Strings are matched whole so that
# brackets inside them do not count.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class TooDeep(ValueError):
    """The document nests arrays/objects deeper than allowed."""


def depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (0 for a scalar).

    Malformed text gives some number; ``json`` then reports what is wrong."""
    if text.count("[") + text.count("{") <= 1:
        return int("[" in text or "{" in text)
    level = deepest = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            level += 1
            deepest = max(deepest, level)
        elif token in "]}":
            level -= 1
    return deepest


def check_depth(text: str, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    # Fast path: fewer brackets than the limit cannot nest deeper than it.
    if text.count("[") + text.count("{") <= max_depth:
        return
    found = depth(text)
    if found > max_depth:
        raise TooDeep(f"JSON nested {found} levels deep; at most {max_depth} are accepted")


def loads(text: str | bytes, max_depth: int = DEFAULT_MAX_DEPTH, **kwargs: Any) -> Any:
    """``json.loads`` that refuses documents nested deeper than ``max_depth``."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    check_depth(text, max_depth)
    return json.loads(text, **kwargs)
