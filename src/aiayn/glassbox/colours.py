"""The glass box's one colour scale: the notebook views, the HTML report and the live page
(`serve/static/serve.html`'s `colour`, the same rule in JavaScript) shade a number alike.

Weights and probabilities (`unit`): blue, its opacity the value itself (0 to 1). Any other
number: red when positive, blue when negative, its opacity |v| / scale (the largest |v| of
what is drawn beside it), at most 0.85 so the printed value stays legible. A masked score
(-inf) is grey.
"""

from __future__ import annotations

BLUE, RED = "31,119,180", "214,39,40"  # matplotlib's tab:blue and tab:red
MASKED = "#ccc"
SIGNED_OPACITY = 0.85


def colour(v: float | None, scale: float, unit: bool) -> str:
    """A CSS colour for `v` (None: no value, drawn as masked)."""
    if v is None or v == float("-inf"):
        return MASKED
    if unit:
        return f"rgba({BLUE},{min(1.0, max(0.0, v)):.3f})"
    a = min(1.0, abs(v) / scale) if scale else 0.0
    return f"rgba({RED if v > 0 else BLUE},{SIGNED_OPACITY * a:.3f})"
