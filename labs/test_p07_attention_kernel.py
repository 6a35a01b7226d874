"""Phase 07 lab: grades the answer cells of 07_attention_kernel.ipynb (one test per exercise).

The kernel exercises need Triton (Linux x86_64); elsewhere they are skipped with the reason, and the
online-softmax exercise is still graded.
"""

from __future__ import annotations

import pytest

from labs.checks import p07

NOTEBOOK = "07_attention_kernel"

needs_triton = pytest.mark.skipif(not p07.TRITON_AVAILABLE, reason=p07.kernel_labs_message())


def test_online_softmax_update(answers):
    p07.check_online_softmax_update(answers(NOTEBOOK).get("online_softmax_update"))


@needs_triton
def test_store_kv_kernel(answers):
    p07.check_store_kv_kernel(answers(NOTEBOOK).get("_store_kv_kernel"))


@needs_triton
def test_store_kv(answers):
    p07.check_store_kv(answers(NOTEBOOK).get("store_kv"))


@needs_triton
def test_paged_decode_kernel(answers):
    p07.check_paged_decode_kernel(answers(NOTEBOOK).get("_paged_decode_kernel"))


@needs_triton
def test_paged_decode(answers):
    p07.check_paged_decode(answers(NOTEBOOK).get("paged_decode"))
