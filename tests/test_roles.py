"""mini/roles.py: roles are discoverable from `import mini`, chosen once when an engine is built, and a
replaced part lives in a subclass of its home class (static parts stay static, siblings are bound)."""

from __future__ import annotations

import inspect
import pathlib
import subprocess
import sys

import pytest

from mini import roles
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_manager import KVCacheManager

MINI = pathlib.Path(roles.__file__).parent


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
        roles.choose({"no_such_part": len})
    assert "touch" in str(error.value)
    with pytest.raises(TypeError, match="touch"):
        roles.choose({"touch": 42})


def test_no_replacement_resolves_to_the_home_class_itself():
    assert roles.choose() is roles.DEFAULT
    assert roles.DEFAULT.resolve(BlockPool) is BlockPool


def test_a_replaced_method_lives_in_a_subclass_built_once():
    calls = []

    def get_new_blocks(self, num_blocks):
        calls.append(num_blocks)
        return BlockPool.get_new_blocks(self, num_blocks)

    choices = roles.choose({"get_new_blocks": get_new_blocks})
    cls = choices.resolve(BlockPool)
    assert cls is not BlockPool and issubclass(cls, BlockPool) and cls is choices.resolve(BlockPool)
    assert cls.replaced_parts == frozenset({"get_new_blocks"}) and BlockPool.replaced_parts == frozenset()
    assert len(cls(4).get_new_blocks(2)) == 2 and calls == [2]
    assert choices.replaced("kv_cache") == ("get_new_blocks",) and choices.replaced("scheduler") == ()


def test_a_class_part_is_what_the_pool_builds():
    class MyQueue(kv_cache_utils.FreeKVCacheBlockQueue):
        pass

    manager = KVCacheManager(8, 4, choices=roles.choose({"FreeKVCacheBlockQueue": MyQueue}))
    assert type(manager.block_pool.free_block_queue) is MyQueue
    assert type(KVCacheManager(8, 4).block_pool.free_block_queue) is kv_cache_utils.FreeKVCacheBlockQueue


def test_a_static_part_stays_static_and_a_reference_sibling_calls_the_replacement():
    seen = []

    def hash_block_tokens(hash_function, parent, token_ids, extra_keys=None):
        seen.append(tuple(token_ids))
        return kv_cache_utils.hash_block_tokens(hash_function, parent, token_ids, extra_keys)

    cls = roles.choose({"hash_block_tokens": hash_block_tokens}).resolve(KVCacheManager)
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
            assert roles.choose().parts == {"touch": inner}
            raise RuntimeError("boom")
        assert roles.choose().parts == {"touch": outer}
        assert roles.choose({"touch": inner}).parts == {"touch": inner}   # an explicit choice wins
    assert roles.choose() is roles.DEFAULT
