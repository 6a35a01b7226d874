"""Phase 01 lab: grades the answer cells of 01_paged_kv.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p01

NOTEBOOK = "01_paged_kv"


def test_free_block_queue(answers):
    p01.check_free_block_queue(answers(NOTEBOOK).get("FreeKVCacheBlockQueue"))


def test_get_new_blocks(answers):
    p01.check_get_new_blocks(answers(NOTEBOOK).get("get_new_blocks"))


def test_free_blocks(answers):
    p01.check_free_blocks(answers(NOTEBOOK).get("free_blocks"))


def test_allocate_slots(answers):
    p01.check_allocate_slots(answers(NOTEBOOK).get("allocate_slots"))
