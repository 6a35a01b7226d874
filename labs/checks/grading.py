"""Mirrors no vllm/v1 file: how a graded check runs (placeholder: isolation lands in the next commit)."""

from __future__ import annotations

import functools
from collections.abc import Callable


def graded(check: Callable[..., None]) -> Callable[..., None]:
    """Mark `check` as the check of an exercise (see the module docstring)."""

    @functools.wraps(check)
    def run(candidate, *args, **kwargs):
        return check(candidate, *args, **kwargs)

    return run
