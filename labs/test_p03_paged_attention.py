"""Phase 03 lab: grades the answer cells of 03_paged_attention.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p03

NOTEBOOK = "03_paged_attention"


def test_store_kv(answers):
    p03.check_store_kv(answers(NOTEBOOK).get("store_kv"))


def test_gather_kv(answers):
    p03.check_gather_kv(answers(NOTEBOOK).get("gather_kv"))


def test_paged_attention(answers):
    p03.check_paged_attention(answers(NOTEBOOK).get("paged_attention"))
