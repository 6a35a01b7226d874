"""vLLM v0.33.0's own implementations of phase 01's mirrored functions pass phase 01's checks (issue 24).

Read from an unpacked vLLM tree ($MINI_VLLM_SOURCE), never copied; adapted only in their call shape: the
names their definitions refer to, the attributes vLLM's `BlockPool` has and mini's lacks (`metrics_collector`,
`_reuse_watchers`) and vLLM's `KVCacheBlock.pool` field. `allocate_slots` has no
vLLM counterpart that runs on its own (vLLM's goes through the KV-cache coordinator).
"""

from __future__ import annotations

import collections.abc
import typing
from typing import Any

import pytest

import mini.core.block_pool as block_pool_module
from mini.core.kv_cache_utils import KVCacheBlock
from tests.course.fidelity import check_of, vllm_definition

PHASE = "01_paged_kv"
BLOCK_POOL = "vllm/v1/core/block_pool.py"


def vllm_namespace() -> dict[str, Any]:
    names = {name: getattr(typing, name) for name in ("Any", "ClassVar", "TypeVar")}
    names.update({name: getattr(collections.abc, name) for name in ("Callable", "Iterable", "Iterator", "Sequence")})
    return {**names, "KVCacheBlock": KVCacheBlock, "BlockPool": block_pool_module.BlockPool}


class VllmShapedBlock(KVCacheBlock):
    """mini's KVCacheBlock with vLLM's `pool` field (None: the block belongs to the pool freeing it)."""

    pool = None


def as_vllm_pool(pool: Any) -> Any:
    """Give mini's BlockPool the attributes vLLM's methods read."""
    pool.__dict__.setdefault("metrics_collector", None)
    pool.__dict__.setdefault("_reuse_watchers", {})
    return pool


def test_vllm_free_block_queue_passes():
    queue_class = vllm_definition("vllm/v1/core/kv_cache_utils.py", "FreeKVCacheBlockQueue", vllm_namespace())
    check_of(PHASE, "FreeKVCacheBlockQueue")(queue_class)


def test_vllm_get_new_blocks_passes():
    vllm_get_new_blocks = vllm_definition(BLOCK_POOL, "BlockPool.get_new_blocks", vllm_namespace())

    def get_new_blocks(self, num_blocks):
        return vllm_get_new_blocks(as_vllm_pool(self), num_blocks)

    check_of(PHASE, "get_new_blocks")(get_new_blocks)


def test_vllm_free_blocks_passes(monkeypatch: pytest.MonkeyPatch):
    vllm_free_blocks = vllm_definition(BLOCK_POOL, "BlockPool.free_blocks", vllm_namespace())
    monkeypatch.setattr(block_pool_module, "KVCacheBlock", VllmShapedBlock)  # pools built with vLLM's block shape

    def free_blocks(self, ordered_blocks):
        return vllm_free_blocks(as_vllm_pool(self), ordered_blocks)

    check_of(PHASE, "free_blocks")(free_blocks)
