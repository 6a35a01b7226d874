"""Phase 00 lab: grades the answer cells of 00_autoregressive_loop.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p00

NOTEBOOK = "00_autoregressive_loop"


def test_kv_bytes_per_block(answers):
    p00.check_kv_bytes_per_block(answers(NOTEBOOK).get("kv_bytes_per_block"))


def test_generate_naive(answers):
    p00.check_generate_naive(answers(NOTEBOOK).get("generate_naive"))


def test_generate_with_kv_cache(answers):
    p00.check_generate_with_kv_cache(answers(NOTEBOOK).get("generate_with_kv_cache"))
