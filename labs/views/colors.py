"""Mirrors no vllm/v1 file: the views' colours, one per request, fixed by the order requests were added."""

from __future__ import annotations

from collections.abc import Sequence

REQUEST_COLORS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
FREE_COLOR = "#f4f4f4"
NULL_COLOR = "#404040"
SHARED_COLOR = "#8c564b"


def request_colors(request_ids: Sequence[str]) -> dict[str, str]:
    """Request id -> colour (the palette repeats after 10 requests)."""
    return {req_id: REQUEST_COLORS[index % len(REQUEST_COLORS)] for index, req_id in enumerate(request_ids)}
