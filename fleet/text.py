"""Text that goes into bounded columns."""

from __future__ import annotations

# The length of every reason and message column (state_reason, audit message).
REASON_LENGTH = 500


def clip(text: str, limit: int = REASON_LENGTH) -> str:
    """``text`` cut to ``limit`` characters, ending in an ellipsis when cut: a
    derived reason ("node n1 failed: <the node's reason>") never overflows its
    column."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
