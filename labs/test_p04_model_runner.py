"""Phase 04 lab: grades the answer cells of 04_model_runner.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p04

NOTEBOOK = "04_model_runner"


def test_compute_logits_indices(answers):
    p04.check_logits_indices(answers(NOTEBOOK).get("compute_logits_indices"))


def test_rms_norm(answers):
    p04.check_rms_norm(answers(NOTEBOOK).get("rms_norm"))


def test_apply_rotary(answers):
    p04.check_apply_rotary(answers(NOTEBOOK).get("apply_rotary"))


def test_build_attention_metadata(answers):
    p04.check_build_attention_metadata(answers(NOTEBOOK).get("build_attention_metadata"))


def test_run_model(answers):
    p04.check_run_model(answers(NOTEBOOK).get("run_model"))


def test_update_states(answers):
    p04.check_update_states(answers(NOTEBOOK).get("update_states"))
