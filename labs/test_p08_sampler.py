"""Phase 08 lab: grades the answer cells of 08_sampler.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p08

NOTEBOOK = "08_sampler"


def test_apply_temperature(answers):
    p08.check_apply_temperature(answers(NOTEBOOK).get("apply_temperature"))


def test_apply_top_k_top_p(answers):
    p08.check_apply_top_k_top_p(answers(NOTEBOOK).get("apply_top_k_top_p"))


def test_random_sample(answers):
    p08.check_random_sample(answers(NOTEBOOK).get("random_sample"))


def test_gather_logprobs(answers):
    p08.check_gather_logprobs(answers(NOTEBOOK).get("gather_logprobs"))
