"""Small arithmetic shared across the engine.

Mirrors vllm/utils/math_utils.py (`cdiv`, `round_up`): one definition each, used everywhere.
"""

from __future__ import annotations


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division for ints: how many size-`denominator` pieces cover `numerator` items."""
    return -(-numerator // denominator)
