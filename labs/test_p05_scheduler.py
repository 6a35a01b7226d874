"""Phase 05 lab: grades the answer cells of 05_scheduler.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p05

NOTEBOOK = "05_scheduler"


def test_num_tokens_to_schedule(answers):
    p05.check_num_tokens_to_schedule(answers(NOTEBOOK).get("num_tokens_to_schedule"))


def test_select_preemption_victim(answers):
    p05.check_select_preemption_victim(answers(NOTEBOOK).get("select_preemption_victim"))


def test_schedule(answers):
    p05.check_schedule(answers(NOTEBOOK).get("schedule"))
