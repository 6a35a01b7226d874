"""Phase 06 lab: grades the answer cells of 06_engine_loop.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p06

NOTEBOOK = "06_engine_loop"


def test_detokenize_incrementally(answers):
    p06.check_detokenize_incrementally(answers(NOTEBOOK).get("detokenize_incrementally"))


def test_check_stop_strings(answers):
    p06.check_check_stop_strings(answers(NOTEBOOK).get("check_stop_strings"))


def test_check_stop(answers):
    p06.check_check_stop(answers(NOTEBOOK).get("check_stop"))


def test_step(answers):
    p06.check_step(answers(NOTEBOOK).get("step"))
