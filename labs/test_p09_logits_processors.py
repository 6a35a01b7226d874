"""Phase 09 lab: grades the answer cells of 09_logits_processors.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p09

NOTEBOOK = "09_logits_processors"


def test_apply_all_penalties(answers):
    p09.check_apply_all_penalties(answers(NOTEBOOK).get("apply_all_penalties"))


def test_process_dict_updates(answers):
    p09.check_process_dict_updates(answers(NOTEBOOK).get("process_dict_updates"))


def test_min_tokens_processor(answers):
    p09.check_min_tokens_processor(answers(NOTEBOOK).get("MinTokensLogitsProcessor"))


def test_condense(answers):
    p09.check_condense(answers(NOTEBOOK).get("condense"))
