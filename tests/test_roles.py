"""mini/roles.py: roles are discoverable from `import mini`, the replaced parts travel in `EngineConfig.parts`
and are resolved once where each component is built, a replaced part lives in a subclass of its home class (or
of the role's reference class; static parts stay static, siblings are bound), and no fast path asks."""

from __future__ import annotations

import inspect
import pathlib
import subprocess
import sys

import pytest

from mini import roles
from mini.config import EngineConfig
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_manager import KVCacheManager

MINI = pathlib.Path(roles.__file__).parent
CONFIG = EngineConfig()


def test_import_mini_lists_every_role_without_importing_an_engine_module():
    code = ("import sys, mini; names = mini.roles.part_names(); "
            "loaded = sorted(m for m in sys.modules if m.startswith('mini.') and m != 'mini.roles'); "
            "print(len(names), loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, loaded = out.split(" ", 1)
    assert int(count) == len(roles.part_names()) >= 40
    assert loaded.strip() == "[]"


@pytest.mark.parametrize("part", roles.part_names())
def test_every_part_is_an_attribute_of_its_home_class(part):
    if part in {"triton_store_kv", "paged_decode", "_store_kv_kernel", "_paged_decode_kernel"}:
        pytest.importorskip("triton")
    home = roles.home_class(part)
    assert inspect.getattr_static(home, part, None) is not None, f"{home.__qualname__} has no part {part!r}"
    assert roles.reference(part) is not None


def test_the_role_table_is_small_and_every_part_belongs_to_one_role():
    assert len(roles.ROLES) <= 10
    parts = [part for role in roles.ROLES for part in role.parts]
    assert len(parts) == len(set(parts))


def test_no_call_time_registry_is_left_in_the_engine():
    assert not (MINI / "seams.py").exists()
    offenders = [str(path.relative_to(MINI)) for path in MINI.rglob("*.py")
                 if "is_overridden" in path.read_text() or "mini.seams" in path.read_text()
                 or "@seam(" in path.read_text()]
    assert offenders == []


def test_unknown_or_non_callable_parts_are_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed names") as error:
        EngineConfig(parts={"no_such_part": len})
    assert "touch" in str(error.value)
    with pytest.raises(TypeError, match="touch"):
        EngineConfig(parts={"touch": 42})
    with pytest.raises(TypeError, match="parts must be a dict"):
        EngineConfig(parts=[("touch", len)])


def test_no_replacement_resolves_to_the_home_class_itself():
    assert EngineConfig().parts == {}
    assert roles.resolve(EngineConfig(), BlockPool) is BlockPool
    assert roles.resolve(None, BlockPool) is BlockPool
    assert roles.with_pending(CONFIG) is CONFIG   # nothing chosen: the same config, not a copy


def test_a_replaced_method_lives_in_a_subclass_built_once():
    calls = []

    def get_new_blocks(self, num_blocks):
        calls.append(num_blocks)
        return BlockPool.get_new_blocks(self, num_blocks)

    config = EngineConfig(parts={"get_new_blocks": get_new_blocks})
    cls = roles.resolve(config, BlockPool)
    assert cls is not BlockPool and issubclass(cls, BlockPool) and cls is roles.resolve(config, BlockPool)
    assert cls.get_new_blocks is get_new_blocks and BlockPool.get_new_blocks is not get_new_blocks
    assert len(cls(4).get_new_blocks(2)) == 2 and calls == [2]
    assert roles.replaced(config, "kv_cache") == ("get_new_blocks",) and roles.replaced(config, "scheduler") == ()
    assert roles.resolve(config, KVCacheManager) is KVCacheManager   # a part of another home changes nothing


def test_a_class_part_is_what_the_pool_builds():
    class MyQueue(kv_cache_utils.FreeKVCacheBlockQueue):
        pass

    manager = KVCacheManager(8, 4, config=EngineConfig(parts={"FreeKVCacheBlockQueue": MyQueue}))
    assert type(manager.block_pool.free_block_queue) is MyQueue
    assert type(KVCacheManager(8, 4).block_pool.free_block_queue) is kv_cache_utils.FreeKVCacheBlockQueue


def test_a_static_part_stays_static_and_a_reference_sibling_calls_the_replacement():
    seen = []

    def hash_block_tokens(hash_function, parent, token_ids, extra_keys=None):
        seen.append(tuple(token_ids))
        return kv_cache_utils.hash_block_tokens(hash_function, parent, token_ids, extra_keys)

    cls = roles.resolve(EngineConfig(parts={"hash_block_tokens": hash_block_tokens}), KVCacheManager)
    assert isinstance(inspect.getattr_static(cls, "hash_block_tokens"), staticmethod)
    hashes = cls.hash_request_tokens(2, [1, 2, 3, 4, 5])   # the reference, with the replacement bound in
    assert seen == [(1, 2), (3, 4)]
    assert hashes == kv_cache_utils.hash_request_tokens(2, [1, 2, 3, 4, 5])


def test_use_blocks_stack_and_are_undone_even_after_an_error():
    def outer(self, blocks):
        return None

    def inner(self, blocks):
        return None

    with roles.use(touch=outer):
        with pytest.raises(RuntimeError), roles.use(touch=inner):
            assert roles.with_pending(CONFIG).parts == {"touch": inner}
            raise RuntimeError("boom")
        assert roles.with_pending(CONFIG).parts == {"touch": outer}
        assert roles.with_pending(CONFIG, {"touch": inner}).parts == {"touch": inner}   # an explicit choice wins
    assert roles.pending() == {} and roles.with_pending(CONFIG) is CONFIG


# ------------------------------------------------------------------ no course switch in a fast path
REMOVED_NAMES = ("replaced_parts", "INPUT_PARTS", "FORWARD_ROLES", "use_fused", "uses_reference_inputs",
                 "for_choices", "Choices")


def test_no_engine_module_asks_what_the_course_replaced():
    """The fast classes never consult the course: no flag, set or test of replaced parts is left in mini/."""
    offenders = sorted(f"{path.relative_to(MINI)}: {name}" for path in MINI.rglob("*.py")
                       for name in REMOVED_NAMES if name in path.read_text())
    assert offenders == []


def test_every_reference_class_is_a_subclass_of_a_home_or_the_home_itself():
    """A role's reference class calls the parts its fast class fuses: it must hold them (inherit or own them)."""
    assert roles.ROLES and any(role.reference_classes for role in roles.ROLES)
    for role in roles.ROLES:
        for fast, readable in role.reference_classes.items():
            fast_class, reference_class = roles._import_class(fast), roles._import_class(readable)
            assert reference_class is not fast_class
            homes = [roles._import_class(home) for home in role.homes]
            assert any(issubclass(reference_class, home) for home in homes), (fast, readable)
