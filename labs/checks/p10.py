"""Checks for phase 10 (prefix caching), against mini.core.

    check_hash_block_tokens(hash_block_tokens)           vs mini.core.kv_cache_utils.hash_block_tokens
    check_hash_request_tokens(hash_request_tokens)       vs mini.core.kv_cache_utils.hash_request_tokens
    check_cache_full_blocks(cache_full_blocks)           vs mini.core.block_pool.BlockPool.cache_full_blocks
    check_get_computed_blocks(get_computed_blocks)       vs
    mini.core.kv_cache_manager.KVCacheManager.get_computed_blocks check_touch(touch)
    vs mini.core.block_pool.BlockPool.touch check_maybe_evict_cached_block(_maybe_evict_cached_block)
                                                         vs mini.core.block_pool.BlockPool._maybe_evict_cached_block

The three mechanism checks (publish, look up, evict) run a real reference `KVCacheManager` and one built with
the learner's part side by side through a scripted workload and seeded random ones (`run_workload`), compare
the two pools after every step and report the first step where they part.

vLLM v0.33.0's own `hash_block_tokens` (vllm/v1/core/kv_cache_utils.py), `BlockPool.touch` and
`BlockPool._maybe_evict_cached_block` (vllm/v1/core/block_pool.py), `KVCacheManager.get_computed_blocks`
(vllm/v1/core/kv_cache_manager.py, with `FullAttentionManager.find_longest_cache_hit` from
vllm/v1/core/single_type_kv_cache_manager.py) and its request block hasher (`get_request_block_hasher`, vLLM's
counterpart of mini's `hash_request_tokens`) pass these checks, adapted only in their call shape
(tests/course/vllm_answers/test_p10.py).
"""

from __future__ import annotations

import contextlib
import random
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from labs.checks.common import NotImplementedYet, _where_it_raised, calling, expect_equal, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini import roles
from mini.config import EngineConfig
from mini.core import kv_cache_utils
from mini.core.block_pool import BlockPool
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.kv_cache_utils import KVCacheBlock, sha256
from mini.core.request import Request
from mini.sampling_params import SamplingParams


def _salted_sha256(input_object: Any) -> bytes:
    """Another hash function: `hash_block_tokens` must call the one it is given, not a fixed one."""
    return sha256(("another hash function", input_object))


def _hash_functions() -> dict[str, Callable[[Any], bytes]]:
    functions = {"sha256": sha256, "another hash function": _salted_sha256}
    with contextlib.suppress(ValueError):  # vLLM's sha256_cbor, when cbor2 is installed
        functions["sha256_cbor"] = kv_cache_utils.get_hash_function("sha256_cbor")
    return functions


def _reference(name: str) -> Callable:
    return roles.reference(name)


# ---------------------------------------------------------------- hash_block_tokens
def _hash_cases(rng: random.Random, num_cases: int) -> list[dict[str, Any]]:
    parent = sha256("some parent block")
    salt = (("cache_salt", "tenant-a"),)
    cases = [
        {"hash_function": "sha256", "parent_block_hash": None, "curr_block_token_ids": [1, 2, 3, 4],
         "extra_keys": None},
        {"hash_function": "sha256", "parent_block_hash": parent, "curr_block_token_ids": [1, 2, 3, 4],
         "extra_keys": None},
        {"hash_function": "sha256", "parent_block_hash": None, "curr_block_token_ids": [1, 2, 3, 4],
         "extra_keys": salt},
        {"hash_function": "another hash function", "parent_block_hash": None, "curr_block_token_ids": (5, 6),
         "extra_keys": None},
    ]
    names = list(_hash_functions())
    for _ in range(num_cases):
        cases.append({
            "hash_function": rng.choice(names),
            "parent_block_hash": rng.choice([None, rng.randbytes(32)]),
            "curr_block_token_ids": [rng.randrange(100) for _ in range(rng.randint(1, 8))],
            "extra_keys": rng.choice([None, salt, (("cache_salt", "s"), ("lora", 1))]),
        })
    return cases


def _hash_block_diagnosis(case: dict[str, Any], hash_function: Callable[[Any], bytes], got: Any) -> str:
    """Which plausible mistake gives `got` for this case: the hint that locates it."""
    parent, tokens, extra = case["parent_block_hash"], case["curr_block_token_ids"], case["extra_keys"]
    seeded = kv_cache_utils.NONE_HASH if parent is None else parent
    if not isinstance(got, bytes):
        return (f"return the digest the given hash function computes (bytes, as vLLM's BlockHash), not a "
                f"{type(got).__name__}: the engine picks that function, and compares and stores its digests")
    variants = [
        (sha256((seeded, tuple(tokens), extra)),
         ("use the hash function you are given (the engine picks it with prefix_caching_hash_algo, the check "
          "calls yours with several): the given hash function, not a fixed one")),
        (hash_function((parent, tuple(tokens), extra)),
         ("a first block (parent_block_hash None) chains to NONE_HASH, the seed every process shares: "
          "NONE_HASH stands in for the missing parent")),
        (hash_function((seeded, list(tokens), extra)),
         ("the token ids go into the key as a tuple: pickle writes a list and a tuple differently, so the "
          "same block passed as a list would get another hash than vLLM's")),
        (hash_function((seeded, tuple(tokens), None)),
         ("the extra_keys are part of the key (a salted request's first block carries its cache_salt there): "
          "pass them on unchanged")),
        (hash_function((seeded, tuple(tokens))),
         ("the key is always the triple, extra_keys included even when it is None (vLLM's key, so that the "
          "digests equal vLLM's)")),
        (hash_function((tuple(tokens), seeded, extra)),
         "the triple's order is vLLM's: the parent's hash first, then the token ids, then the extra_keys"),
    ]
    for value, hint in variants:
        if value == got and value != hash_function((seeded, tuple(tokens), extra)):
            return hint
    return ("the digest differs from vLLM's key for this block: one call of the given hash function on the "
            "triple (parent hash, token ids, extra_keys), in vLLM's order and types")


@graded
def check_hash_block_tokens(candidate: Callable, seeds: Iterable[int] = range(5)) -> None:
    reference = _reference("hash_block_tokens")
    functions = _hash_functions()
    num_cases = 0
    for seed in seeds:
        for case in _hash_cases(random.Random(seed), 6):
            args = dict(case, hash_function=functions[case["hash_function"]])
            expected = reference(**args)
            with calling("hash_block_tokens", case, expected=expected):
                got = candidate(args["hash_function"], args["parent_block_hash"], args["curr_block_token_ids"],
                                args["extra_keys"])
            if got != expected:
                expect_equal("hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys)",
                             case, expected, got, _hash_block_diagnosis(case, args["hash_function"], got))
            num_cases += 1
    passed("check_hash_block_tokens", num_cases)


# ---------------------------------------------------------------- hash_request_tokens
class _CountingHash:
    """A hash function that counts its calls: one per block hashed."""

    def __init__(self, function: Callable[[Any], bytes]) -> None:
        self.function, self.calls = function, 0

    def __call__(self, input_object: Any) -> bytes:
        self.calls += 1
        return self.function(input_object)


def _short_hashes(value: Any) -> Any:
    """Hashes as short hex prefixes, for messages (anything else as it is)."""
    if isinstance(value, bytes):
        return value[:4].hex() + ".."
    if isinstance(value, (list, tuple)):
        return [_short_hashes(item) for item in value]
    return value


def _chain_variants(block_size: int, tokens: list[int], salt: str | None, hash_function: Callable[[Any], bytes],
                    num_known: int) -> list[tuple[Any, str]]:
    """The answers of plausible mistakes, each with the hint that locates it."""
    block_hash = _reference("hash_block_tokens")
    num_full = len(tokens) // block_size

    def chain(num_blocks: int, extra: Callable[[int], Any], chained: bool = True,
              function: Callable[[Any], bytes] = hash_function, restart: int = -1) -> list[bytes]:
        hashes: list[bytes] = []
        for index in range(num_blocks):
            block = tokens[index * block_size:(index + 1) * block_size]
            parent = hashes[-1] if hashes and chained and index != restart else None
            hashes.append(block_hash(function, parent, block, extra(index)))
        return hashes

    def salted(index: int) -> Any:
        return kv_cache_utils.block_extra_keys(index, salt)

    return [
        (chain(-(-len(tokens) // block_size), salted),
         ("one hash per FULL block: a partial last block gets none (its slots are still being written, so its "
          "content is not final)")),
        (chain(num_full, lambda index: kv_cache_utils.block_extra_keys(0, salt)),
         ("the salt goes into the first block's extra keys only (block_extra_keys of each block's own index): "
          "the chain carries it to every later block through the parent")),
        (chain(num_full, lambda index: None),
         ("a salted request's hashes must differ from an unsalted one's: take each block's extra keys from "
          "block_extra_keys(its index, cache_salt)")),
        (chain(num_full, salted, chained=False),
         ("the hashes are chained: each block's parent is the hash of the block before it (None, i.e. NONE_HASH, "
          "only for block 0), so that equal hashes mean equal prefixes")),
        (chain(num_full, salted, function=sha256),
         "hash with the hash_function argument (the engine picks it), not a fixed one"),
        (chain(num_full, salted, restart=num_known) if num_known else None,
         "the first hashes are known_hashes: keep them, and chain the next block to the last of them"),
    ]


_HASH_REQUEST_HINT = ("one hash per FULL block, chained, in order; the salt enters through the first block's "
                      "extra keys; extend known_hashes instead of starting over")


@graded
def check_hash_request_tokens(candidate: Callable, seeds: Iterable[int] = range(10)) -> None:
    reference, block_hash = _reference("hash_request_tokens"), _reference("hash_block_tokens")
    fixed = [(4, list(range(10)), None, 0, "sha256"), (4, list(range(8)), "tenant-a", 0, "sha256"),
             (16, list(range(55)), None, 1, "sha256"), (2, [7], None, 0, "sha256"),
             (2, list(range(9)), "tenant-b", 2, "sha256"), (4, list(range(13)), None, 0, "another hash function"),
             (2, list(range(12)), None, 3, "sha256"), (4, list(range(16)), None, 4, "sha256")]
    cases = list(fixed)
    for seed in seeds:
        rng = random.Random(seed)
        tokens = [rng.randrange(50) for _ in range(rng.randint(1, 30))]
        block_size = rng.choice([1, 2, 4, 8])
        cases.append((block_size, tokens, rng.choice([None, "salt"]), rng.randint(0, len(tokens) // block_size),
                      rng.choice(["sha256", "another hash function"])))
    functions = _hash_functions()
    for block_size, tokens, salt, num_known, function_name in cases:
        hash_function = functions[function_name]
        full = reference(block_size, tokens, salt, hash_function)
        inputs = {"block_size": block_size, "token_ids": tokens, "cache_salt": salt, "hash_function": function_name,
                  "known_hashes": f"the first {num_known} of the answer"}
        known = list(full[:num_known])
        counting = _CountingHash(hash_function)
        with calling("hash_request_tokens", inputs, hint=_HASH_REQUEST_HINT):   # the reference block hash:
            got = candidate(block_size, tokens, salt, counting, known, hash_block_tokens=block_hash)  # not Ex. 1
        if got != full:
            hint = next((why for variant, why in _chain_variants(block_size, tokens, salt, hash_function, num_known)
                         if variant == got), _HASH_REQUEST_HINT)
            if isinstance(got, list) and len(got) == len(full) and got[:num_known] != full[:num_known]:
                hint = "the first hashes are known_hashes: keep them, and chain the next block to the last of them"
            expect_equal("hash_request_tokens(...) (hashes as hex prefixes)", inputs, _short_hashes(full),
                         _short_hashes(got), hint)
        expect_equal("known_hashes after the call (hashes as hex prefixes)", inputs, _short_hashes(full),
                     _short_hashes(known),
                     "extend known_hashes in place (the engine keeps that list for the request), and return it")
        expect_equal("how many blocks were hashed (calls of hash_function)", inputs,
                     len(full) - num_known, counting.calls,
                     "hash with the hash_function argument (the engine picks it; it was never called)"
                     if counting.calls == 0 else
                     "hash only the blocks known_hashes lacks: a request that grows by one token per step must "
                     "not hash its whole prompt again at every step")
    passed("check_hash_request_tokens", len(cases))


# ---------------------------------------------------------------- the workload driver
# The prefix cache's mechanism (publish full blocks, look them up, take the hits, evict on reuse) is checked
# by running TWO real KVCacheManagers side by side through one workload, as the scheduler drives them: the
# reference, and one built with the learner's part (mini.roles: the engine's own way of choosing a part).
# After every step the two pools are compared (block hashes, ref counts, the cached-block map and its
# duplicates, the free queue, and what the step returned); the first step where they part is reported with
# the operations up to there and the first differing field only.

_BLOCK_SIZE = 4


@dataclass
class _Side:
    """One manager and the requests it serves (each side has its own Request objects)."""

    manager: KVCacheManager
    requests: dict[str, Request] = field(default_factory=dict)


def _manager(parts: dict[str, Any], num_gpu_blocks: int, block_size: int, enable_caching: bool = True
             ) -> KVCacheManager:
    config = EngineConfig(parts=dict(parts))
    return roles.resolve(config, KVCacheManager)(num_gpu_blocks, block_size, enable_caching=enable_caching,
                                                 config=config)


def _ids(blocks: Any) -> Any:
    """Block ids of a list of blocks; anything else (a learner's odd return value) as it is, for the message."""
    if blocks is None or not isinstance(blocks, (list, tuple)):
        return blocks
    return [block.block_id if isinstance(block, KVCacheBlock) else f"not a block: {block!r}"[:60]
            for block in blocks]


def _new_request(op: tuple) -> Request:
    _, request_id, tokens, _, salt, skip = op
    params = SamplingParams(max_tokens=64, prompt_logprobs=1 if skip else None)
    return Request(request_id, list(tokens), params, cache_salt=salt)


def _apply(side: _Side, op: tuple) -> str:
    """Run one scheduler-like operation on a side; return what it did, as one short line."""
    manager, requests, kind, request_id = side.manager, side.requests, op[0], op[1]
    if kind in ("admit", "resume"):
        request = _new_request(op) if kind == "admit" else requests[request_id]
        hits, num_hit_tokens = manager.get_computed_blocks(request)
        num_new = min(op[3], request.num_tokens - num_hit_tokens)
        new_blocks = manager.allocate_slots(request, num_new, num_hit_tokens, hits)
        found = f"hits {_ids(hits)} ({num_hit_tokens} tokens)"
        if new_blocks is None:
            if kind == "admit":
                manager.forget_request(request_id)
            return f"{found}; no room, stays waiting"
        requests[request_id] = request
        request.num_computed_tokens = num_hit_tokens + num_new
        return f"{found}; computes {num_new} tokens in new blocks {_ids(new_blocks)}"
    request = requests[request_id]
    if kind == "finish":
        manager.free(request)
        manager.forget_request(request_id)
        del requests[request_id]
        return "freed its blocks, last block first"
    if kind == "preempt running":  # the scheduler needs room: a running request loses its blocks, keeps its tokens
        manager.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        return f"freed its blocks; it keeps its {request.num_tokens} tokens ({request.num_output_tokens} generated)"
    if kind == "decode":
        request.append_output_token_ids(op[2])
        num_new = 1
    else:  # chunk / preempt: the next tokens of its prompt
        num_new = min(op[2], request.num_tokens - request.num_computed_tokens)
    new_blocks = manager.allocate_slots(request, num_new)
    if new_blocks is None:
        manager.free(request)
        request.num_computed_tokens = 0
        return "no room: preempted (blocks freed)"
    if kind == "preempt":  # scheduled, then preempted in the same step: its new blocks were never written
        manager.uncache_uncomputed_blocks(request)
        manager.free(request)
        request.num_computed_tokens = 0
        return f"scheduled {num_new} tokens in new blocks {_ids(new_blocks)}, then preempted in the same step"
    request.num_computed_tokens += num_new
    return f"computes {num_new} tokens in new blocks {_ids(new_blocks)}"


def _describe(op: tuple) -> str:
    kind, request_id = op[0], op[1]
    if kind == "admit":
        _, _, tokens, chunk, salt, skip = op
        extra = (f", cache_salt={salt!r}" if salt else "") + (", prompt_logprobs (skips reading the cache)"
                                                                if skip else "")
        return f"admit {request_id}: prompt {list(tokens)}{extra}, schedule up to {chunk} tokens"
    if kind == "resume":
        return f"resume {request_id} after its preemption, schedule up to {op[3]} tokens"
    if kind == "decode":
        return f"decode {request_id}: append token {op[2]}, schedule it"
    if kind == "chunk":
        return f"continue {request_id}'s prefill: schedule {op[2]} more tokens"
    if kind == "preempt":
        return f"schedule {op[2]} more tokens of {request_id}, then preempt it in the same step"
    if kind == "preempt running":
        return f"preempt {request_id} while it decodes"
    return f"finish {request_id}"


class _HashNames:
    """Readable names for block hashes: `A[1]` is the hash of request A's block 1 (the chain up to it)."""

    def __init__(self) -> None:
        self.names: dict[bytes, str] = {}

    def learn(self, side: _Side) -> None:
        for request_id, request in side.requests.items():
            hashes = kv_cache_utils.hash_request_tokens(side.manager.block_size, request.all_token_ids,
                                                        request.cache_salt, sha256)
            for index, block_hash in enumerate(hashes):
                self.names.setdefault(block_hash, f"{request_id}[{index}]")

    def __call__(self, block_hash: bytes | None) -> str | None:
        if block_hash is None:
            return None
        if not isinstance(block_hash, bytes):
            return f"not a bytes hash: {block_hash!r}"
        return self.names.get(block_hash, f"unknown hash {block_hash[:3].hex()}..")


def _pool_fields(pool: BlockPool, name: _HashNames) -> dict[str, Any]:
    """What is compared after every step, in the order a difference is reported."""
    return {
        "block_hash": {block.block_id: name(block.block_hash) for block in pool.blocks[1:]},
        "ref_cnt": {block.block_id: block.ref_cnt for block in pool.blocks[1:]},
        "cached_block_hash_to_block": {name(h): block.block_id for h, block in pool.cached_block_hash_to_block.items()},
        "duplicate_cached_blocks": {name(h): list(copies) for h, copies in pool.duplicate_cached_blocks.items()},
        "free queue (head first)": pool.free_block_ids(),
    }


def _first_difference(expected: dict[str, Any], got: dict[str, Any]) -> tuple[str, str, Any, Any] | None:
    """(where, field, expected, got) of the first differing field (and entry, for a dict), or None."""
    for field_name, want in expected.items():
        have = got[field_name]
        if have == want:
            continue
        if isinstance(want, dict) and isinstance(have, dict):
            for key in [*want, *(k for k in have if k not in want)]:
                if want.get(key, "(absent)") != have.get(key, "(absent)"):
                    return (_WHERE[field_name].format(key=key), field_name, want.get(key, "(absent)"),
                            have.get(key, "(absent)"))
        return _WHERE[field_name].format(key=""), field_name, want, have
    return None


_WHERE = {
    "block_hash": "block {key}'s hash",
    "ref_cnt": "block {key}'s ref_cnt",
    "cached_block_hash_to_block": "the cached-block map (hash -> block id), entry {key}",
    "duplicate_cached_blocks": "the duplicates (hash -> ids of the later copies), entry {key}",
    "free queue (head first)": "the free queue (block ids, head first)",
    "what the step did": "what the step did",
}


def _expect_same_pool(what: str, inputs: dict[str, Any], expected: dict[str, Any], got: dict[str, Any],
                      hints: dict[str, str]) -> None:
    __tracebackhide__ = True
    difference = _first_difference(expected, got)
    if difference is not None:
        where, field_name, want, have = difference
        expect_equal(f"{what}: {where}", inputs, want, have, hints.get(field_name, hints["default"]))


def _ops_so_far(log: list[str]) -> str:
    shown = log if len(log) <= 24 else ["..."] + log[-23:]
    return "\n".join(f"    {line}" for line in shown)


_HASH_LEGEND = ("  (hash names: A[1] is the chained hash of request A's block 1, shared by all requests with that "
                "prefix)")


def _diverged(name: str, step: int, log: list[str], field_name: str, detail: str, hint: str) -> AssertionError:
    lines = [f"`{name}`: your pool parts from the reference's at step {step}: {field_name}{detail}",
             "  operations so far (step: what it did in the REFERENCE engine):", _ops_so_far(log),
             _HASH_LEGEND,
             f"  hint: {hint}"]
    return AssertionError("\n".join(lines))


def _raised(name: str, step: int, log: list[str], error: BaseException, hint: str) -> BaseException:
    if isinstance(error, NotImplementedError):
        return NotImplementedYet(f"`{name}` is not implemented yet: replace `raise NotImplementedError()` in its "
                                 f"answer cell")
    where = _where_it_raised(error)
    lines = [f"`{name}`: step {step} raised {type(error).__name__}: {' '.join(str(error).split())[:200]}"]
    if where:
        lines.append(f"  raised at: {where}")
    lines += ["  operations so far (step: what it did in the REFERENCE engine):", _ops_so_far(log), f"  hint: {hint}"]
    return AssertionError("\n".join(lines))


def run_workload(name: str, candidate: Callable, ops: Iterable[tuple] | Callable[[_Side], tuple | None],
                 num_gpu_blocks: int, hints: dict[str, str], block_size: int = _BLOCK_SIZE,
                 max_steps: int = 30) -> int:
    """Drive the reference and a manager holding `candidate` as part `name` through the same operations;
    raise at the first step where they part. `ops`: a list, or a function of the reference side that picks
    the next operation (None: stop). Returns the number of steps."""
    __tracebackhide__ = True
    reference = _Side(_manager({}, num_gpu_blocks, block_size))
    learner = _Side(_manager({name: candidate}, num_gpu_blocks, block_size))
    names, log = _HashNames(), []
    script = iter(ops) if not callable(ops) else None
    for step in range(1, max_steps + 1):
        op = next(script, None) if script is not None else ops(reference)
        if op is None:
            return step - 1
        did = _apply(reference, op)
        log.append(f"{step}. {_describe(op)} -> {did}")
        try:
            got_did = _apply(learner, op)
        except Exception as error:  # noqa: BLE001 - the learner's part raised, or broke the pool so the engine did
            raise _raised(name, step, log, error, hints["raised"]) from None
        names.learn(reference)
        names.learn(learner)
        expected = {"what the step did": did, **_pool_fields(reference.manager.block_pool, names)}
        got = {"what the step did": got_did, **_pool_fields(learner.manager.block_pool, names)}
        difference = _first_difference(expected, got)
        if difference is not None:
            where, field_name, want, have = difference
            hint = hints.get(field_name, hints["default"])
            if field_name == "what the step did" and op[0] == "resume" and "resume" in hints:
                hint = hints["resume"]
            raise _diverged(name, step, log, where, f": expected {want}, got {have}", hint)
    return max_steps


def scripted_ops(block_size: int = _BLOCK_SIZE) -> list[tuple]:
    """The fixed workload (block size 4, a pool of 11 blocks): hits, a full-prompt hit (the last token is
    recomputed, so a duplicate block appears), lazy eviction of a freed cached block and of a duplicate,
    a hit revived from the free queue, a preemption in the same step, a salted request, a request that
    skips reading the cache, and a request preempted while decoding and resumed (its generated tokens fill
    blocks it can hit again)."""
    assert block_size == 4
    prompt = list(range(1, 9))   # two full blocks
    return [
        ("admit", "A", prompt + [9, 10], 16, None, False),
        ("admit", "B", prompt + [11, 12, 13, 14], 16, None, False),
        ("admit", "C", prompt, 16, None, False),
        ("decode", "A", 20), ("decode", "A", 21),
        ("finish", "A"), ("finish", "C"),
        ("admit", "D", list(range(30, 46)), 16, None, False),
        ("admit", "E", list(range(50, 62)), 4, None, False),
        ("chunk", "E", 4), ("chunk", "E", 4),
        ("finish", "B"), ("finish", "D"),
        ("admit", "F", prompt + [11, 12, 13, 14, 15], 16, None, False),
        ("admit", "G", list(range(60, 72)), 4, None, False),
        ("preempt", "G", 8),
        ("resume", "G", None, 16),
        ("finish", "F"), ("finish", "G"),
        ("admit", "H", prompt + [11], 16, "tenant-b", False),
        ("admit", "I", prompt + [11, 12, 13, 14, 15], 16, None, True),
        ("finish", "H"), ("finish", "I"),
        ("admit", "J", list(range(80, 86)), 16, None, False),
        ("decode", "J", 86), ("decode", "J", 87), ("decode", "J", 88),
        ("preempt running", "J"),
        ("resume", "J", None, 16),
        ("finish", "J"),
    ]


def random_ops(seed: int, block_size: int) -> Callable[[_Side], tuple | None]:
    """A seeded random workload: requests built from three shared prefixes and short tails of a tiny
    vocabulary (so tails collide too), chunked prefills, decodes, finishes, preemptions, a few salts."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 6) for _ in range(rng.randint(1, 3) * block_size + rng.randrange(2))]
                for _ in range(3)]
    counter = iter(range(1, 1000))

    def next_op(reference: _Side) -> tuple | None:
        requests = reference.requests
        prefilling = [r for r in requests.values() if 0 < r.num_computed_tokens < r.num_tokens]
        done = [r for r in requests.values() if r.num_computed_tokens == r.num_tokens]
        preempted = [r for r in requests.values() if r.num_computed_tokens == 0]
        choices = ["admit"] * (3 if len(requests) < 4 else 1) + ["finish"] * (len(requests) > 0) * 2
        choices += ["chunk", "chunk", "preempt"] * bool(prefilling) + ["decode", "decode"] * bool(done)
        choices += ["resume"] * bool(preempted) + ["preempt running"] * bool(done)
        kind = rng.choice(choices)
        if kind == "admit":
            request_id = f"R{next(counter)}"
            tokens = rng.choice(prefixes) + [rng.randrange(1, 6) for _ in range(rng.randrange(1, 2 * block_size))]
            return ("admit", request_id, tokens, rng.choice([block_size, 2 * block_size, 64]),
                    "tenant-b" if rng.random() < 0.1 else None, rng.random() < 0.08)
        if kind == "finish":
            return ("finish", rng.choice(sorted(requests)))
        if kind in ("chunk", "preempt"):
            return (kind, rng.choice(prefilling).request_id, rng.choice([1, block_size, 2 * block_size]))
        if kind == "decode":
            return ("decode", rng.choice(done).request_id, rng.randrange(1, 6))
        if kind == "preempt running":
            return ("preempt running", rng.choice(done).request_id)
        return ("resume", rng.choice(preempted).request_id, None, 64)

    return next_op


def _workloads(name: str, candidate: Callable, seeds: Iterable[int], hints: dict[str, str]) -> int:
    """The scripted workload, then one seeded random workload per seed (block sizes 2 and 4, small pools)."""
    __tracebackhide__ = True
    num_steps = run_workload(name, candidate, scripted_ops(), 11, hints)
    for seed in seeds:
        rng = random.Random(seed)
        block_size = rng.choice([2, 4])
        num_steps += run_workload(name, candidate, random_ops(seed, block_size), rng.randint(6, 12), hints,
                                  block_size=block_size, max_steps=28)
    return num_steps


_RAISED_HINT = ("run the operations above on `KVCacheManager(11, 4, enable_caching=True)` with your function "
                "plugged (`labs.plug`) to see the traceback; an engine assert (`was free with ref_cnt ...`, "
                "`not in the free queue`) means an earlier step left the pool inconsistent")

# ---------------------------------------------------------------- cache_full_blocks
_CACHE_FULL_HINTS = {
    "block_hash": "publish exactly the blocks that became full: indexes [num_cached_blocks, num_full_blocks) of "
                  "`blocks`, each under the hash of the same index in `block_hashes` (a duplicate holds its hash "
                  "too: eviction reads it from the block); a block that already holds a hash (a prefix hit this "
                  "request took) keeps it",
    "cached_block_hash_to_block": "a hash not in the map yet maps to its block; a hit must resolve to the OLDEST "
                                  "block with that hash, so an existing entry is never overwritten",
    "duplicate_cached_blocks": "two requests that computed the same prefix hold two blocks with one hash: the "
                               "later one is kept as a duplicate, duplicate_cached_blocks[hash][block_id]; a "
                               "block that already holds a hash (a prefix hit) is not registered again",
    "default": "the cache differs, so later hits and evictions differ: cache_full_blocks changes only block "
               "hashes and the map (no ref counts, no free queue)",
    "raised": _RAISED_HINT,
}


@graded
def check_cache_full_blocks(candidate: Callable, seeds: Iterable[int] = range(6)) -> None:
    num_steps = _workloads("cache_full_blocks", candidate, seeds, _CACHE_FULL_HINTS)
    passed("check_cache_full_blocks", num_steps)


# ---------------------------------------------------------------- get_computed_blocks
_LOOKUP_HINT = ("the hits are the cached blocks of the longest run of the request's leading full blocks with no "
                "miss, and they must leave the request's last token (prompt or generated) to compute, for its "
                "logits; no hits when the request may not read the cache (prefix_cache_lookup_enabled)")
_RESUME_HINT = ("this request was preempted after it had generated tokens, and is now resumed: its generated "
                "tokens are part of its sequence, they filled blocks that were cached, and its last token is the "
                "last of ALL its tokens (request.num_tokens counts the prompt and the generated tokens)")
_GET_COMPUTED_HINTS = {
    "what the step did": _LOOKUP_HINT,
    "resume": _RESUME_HINT,
    "ref_cnt": "a lookup changes nothing: allocate_slots takes the hits (touch) once the request is admitted",
    "free queue (head first)": "a lookup changes nothing: allocate_slots takes the hits (touch) once the request "
                               "is admitted",
    "default": _LOOKUP_HINT,
    "raised": _RAISED_HINT,
}


def _lookup_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    """A request (its prompt, the tokens it generated before a preemption), and which of its chain's full
    blocks the pool caches (indexes): a hole stops the hit."""
    cases = [
        {"block_size": 4, "prompt": list(range(1, 18)), "generated": [], "cached": [0, 2, 3], "prompt_logprobs": False},
        {"block_size": 4, "prompt": list(range(1, 17)), "generated": [], "cached": [0, 1, 2, 3],
         "prompt_logprobs": False},
        {"block_size": 4, "prompt": list(range(1, 18)), "generated": [], "cached": [0, 1, 2, 3],
         "prompt_logprobs": False},
        {"block_size": 16, "prompt": list(range(1, 56)), "generated": [], "cached": [0, 1, 2],
         "prompt_logprobs": False},
        {"block_size": 4, "prompt": list(range(1, 18)), "generated": [], "cached": [0, 1, 2, 3],
         "prompt_logprobs": True},
        {"block_size": 4, "prompt": [1, 2, 3], "generated": [], "cached": [], "prompt_logprobs": False},
        # resumed after a preemption: the generated tokens filled blocks that were cached
        {"block_size": 4, "prompt": list(range(1, 11)), "generated": list(range(11, 18)), "cached": [0, 1, 2, 3],
         "prompt_logprobs": False},
        {"block_size": 4, "prompt": list(range(1, 7)), "generated": [7, 8, 9], "cached": [0, 1],
         "prompt_logprobs": False},
        {"block_size": 4, "prompt": list(range(1, 9)), "generated": [9, 10, 11, 12], "cached": [0, 1, 2],
         "prompt_logprobs": False},
    ]
    for seed in seeds:
        rng = random.Random(seed)
        for _ in range(3):
            block_size = rng.choice([1, 2, 4])
            prompt = [rng.randrange(1, 50) for _ in range(rng.randint(1, 6 * block_size))]
            generated = [rng.randrange(1, 50) for _ in range(rng.choice([0, 0, rng.randint(1, 3 * block_size)]))]
            num_full = (len(prompt) + len(generated)) // block_size
            cases.append({"block_size": block_size, "prompt": prompt, "generated": generated,
                          "prompt_logprobs": rng.random() < 0.1,
                          "cached": sorted(rng.sample(range(num_full), rng.randint(0, num_full)))})
    return cases


def _lookup_setup(manager: KVCacheManager, case: dict[str, Any]) -> Request:
    """Cache the chosen blocks of the case's chain (then free them: free but still cached, some in use)."""
    params = SamplingParams(max_tokens=64, prompt_logprobs=1 if case["prompt_logprobs"] else None)
    request = Request("req", case["prompt"], params)
    if case["generated"]:
        request.append_output_token_ids(list(case["generated"]))
        request.num_preemptions = 1
    hashes = kv_cache_utils.hash_request_tokens(case["block_size"], request.all_token_ids, None, sha256)
    pool = manager.block_pool
    blocks = pool.get_new_blocks(len(hashes))
    for index in case["cached"]:
        pool.cache_full_blocks(blocks, hashes, index, index + 1)
    pool.free_blocks(blocks[::2])
    return request


def _hits_before_first_miss(case: dict[str, Any]) -> int:
    """How many leading chain blocks are cached with no hole."""
    num_leading = 0
    while num_leading in case["cached"]:
        num_leading += 1
    return num_leading


def _lookup_hint(case: dict[str, Any], expected: tuple, got: tuple) -> str:
    """The rule this case exercises, when the hit list tells which one was broken."""
    got_ids, got_num = got
    block_size, num_prompt = case["block_size"], len(case["prompt"])
    num_tokens = num_prompt + len(case["generated"])
    if not isinstance(got_ids, list) or not all(isinstance(i, int) for i in got_ids):
        return ("return (hits, num_hit_tokens): a list of the pool's KVCacheBlock objects (the ones "
                "self.block_pool.get_cached_block returns) and an int")
    if case["prompt_logprobs"] and got_ids:
        return ("a request asking for prompt logprobs may not read the cache (it needs every prompt token's "
                "logits): prefix_cache_lookup_enabled(request) is false, so no hits")
    if got_ids == expected[0] and got_num != expected[1]:
        return "num_hit_tokens counts the TOKENS the hit blocks hold, not the blocks"
    if len(got_ids) > _hits_before_first_miss(case):
        return ("stop at the first miss: a block is useful only if every block before it is cached too (its KV "
                "depends on the whole prefix)")
    if len(got_ids) * block_size >= num_tokens:
        return ("the hits may not cover the whole request: its last token is always computed, because the next "
                "token is sampled from its logits, so a fully cached prompt recomputes its last block")
    prompt_only = min(_hits_before_first_miss(case), (num_prompt - 1) // block_size)
    if case["generated"] and len(got_ids) == prompt_only < len(expected[0]):
        return _RESUME_HINT
    if len(got_ids) < len(expected[0]):
        return ("too few hits: every leading cached block may be reused as long as the request's last token is "
                "left to compute (round down to whole blocks, never below what still leaves that token)")
    return _LOOKUP_HINT


def _lookup_inputs(case: dict[str, Any]) -> dict[str, Any]:
    inputs = {"block_size": case["block_size"], "prompt": case["prompt"]}
    if case["generated"]:
        inputs["generated before its preemption"] = case["generated"]
        inputs["request.num_tokens"] = len(case["prompt"]) + len(case["generated"])
    inputs["prompt_logprobs"] = case["prompt_logprobs"]
    inputs["cached"] = f"the blocks of chain indexes {case['cached']} (block ids = index + 1)"
    return inputs


@graded
def check_get_computed_blocks(candidate: Callable, seeds: Iterable[int] = range(6)) -> None:
    name, num_cases, seeds = "get_computed_blocks", 0, list(seeds)
    for case in _lookup_cases(seeds):
        num_blocks = (len(case["prompt"]) + len(case["generated"])) // case["block_size"] + 3
        reference = _manager({}, num_blocks, case["block_size"])
        learner = _manager({name: candidate}, num_blocks, case["block_size"])
        requests = _lookup_setup(reference, case), _lookup_setup(learner, case)
        names = _HashNames()
        names.learn(_Side(reference, {"req": requests[0]}))
        hits, num_hit_tokens = reference.get_computed_blocks(requests[0])
        expected = (_ids(hits), num_hit_tokens)
        inputs = _lookup_inputs(case)
        before = _pool_fields(learner.block_pool, names)
        with calling(name, inputs, expected=expected, hint=_LOOKUP_HINT):
            returned = candidate(learner, requests[1])
        if not (isinstance(returned, (tuple, list)) and len(returned) == 2):
            expect_equal("get_computed_blocks(self, request)", inputs, expected, returned,
                         "return a pair (hits, num_hit_tokens): the hit blocks, then the tokens they hold")
        got = (_ids(returned[0]), returned[1])
        expect_equal("(hit block ids, num_hit_tokens)", inputs, expected, got, _lookup_hint(case, expected, got))
        _expect_same_pool("the pool after the lookup", inputs, before, _pool_fields(learner.block_pool, names),
                          {"default": _GET_COMPUTED_HINTS["ref_cnt"]})
        num_cases += 1
    num_cases += _workloads(name, candidate, seeds, _GET_COMPUTED_HINTS)
    passed("check_get_computed_blocks", num_cases)


# ---------------------------------------------------------------- _maybe_evict_cached_block
_EVICT_HINTS = {
    "return": "True when the block had a hash (it was evicted), False when there was nothing to evict",
    "what the step did": "this step's hits differ because an earlier eviction left a different cache: a hash "
                         "must stop resolving to a block handed out for reuse, and keep resolving while a copy "
                         "of it remains",
    "block_hash": "an evicted block forgets its hash: its slots are about to be overwritten with other tokens",
    "cached_block_hash_to_block": "the evicted block leaves the map; if it was the map's block for its hash and "
                                  "copies remain, the OLDEST copy (first inserted in duplicate_cached_blocks) takes "
                                  "its place, so the hash still resolves",
    "duplicate_cached_blocks": "an evicted copy leaves duplicate_cached_blocks[hash]; a hash left with no copies "
                               "leaves duplicate_cached_blocks",
    "default": "the cache differs after an eviction, so later hits differ: look at the map at the step before",
    "raised": _RAISED_HINT,
}


def _evict_cases() -> list[tuple[str, list[tuple[int, str]], int]]:
    """(what, blocks to cache in order as (block id, hash name), the block to evict)."""
    return [
        ("a block that holds no hash", [(1, "h0")], 2),
        ("the only block of its hash", [(1, "h0"), (2, "h1")], 1),
        ("the map's block of a hash with two later copies", [(1, "h0"), (2, "h0"), (3, "h1"), (4, "h0")], 1),
        ("a later copy (a duplicate)", [(1, "h0"), (2, "h0"), (3, "h0")], 2),
        ("the only later copy of its hash", [(1, "h0"), (2, "h0")], 2),
    ]


@graded
def check_maybe_evict_cached_block(candidate: Callable, seeds: Iterable[int] = range(6)) -> None:
    name = "_maybe_evict_cached_block"
    num_cases = 0
    hashes = {f"h{i}": sha256(("block", i)) for i in range(2)}
    names = _HashNames()
    names.names.update({value: key for key, value in hashes.items()})
    for what, cached, victim in _evict_cases():
        pools = []
        for _ in range(2):   # the reference's pool, and one your function is called on (set up alike)
            pool = BlockPool(6, enable_caching=True)
            blocks = pool.get_new_blocks(5)
            for block_id, hash_name in cached:
                pool.cache_full_blocks([blocks[block_id - 1]], [hashes[hash_name]], 0, 1)
            pools.append(pool)
        reference, learner = pools
        inputs = {"case": what, "cached, in this order (block id, hash)": cached, "evict block": victim,
                  "map before": _pool_fields(reference, names)["cached_block_hash_to_block"],
                  "duplicates before": _pool_fields(reference, names)["duplicate_cached_blocks"]}
        expected_return = BlockPool._maybe_evict_cached_block(reference, reference.blocks[victim])
        with calling(name, inputs, expected=expected_return, hint=_EVICT_HINTS["cached_block_hash_to_block"]):
            got_return = candidate(learner, learner.blocks[victim])
        expect_equal("the return value", inputs, expected_return, got_return, _EVICT_HINTS["return"])
        _expect_same_pool("the pool after the eviction", inputs, _pool_fields(reference, names),
                          _pool_fields(learner, names), _EVICT_HINTS)
        num_cases += 1
    num_cases += _workloads(name, candidate, seeds, _EVICT_HINTS)
    passed("check_maybe_evict_cached_block", num_cases)


# ---------------------------------------------------------------- touch
def _state(pool: BlockPool) -> dict[str, Any]:
    return {"ref_cnts": [b.ref_cnt for b in pool.blocks], "free_queue": pool.free_block_ids()}


_TOUCH_RAISED_HINT = ("the free queue holds only free blocks: only a free block (ref_cnt 0) leaves it when touched; a "
                      "block in use (ref_cnt >= 1) and the null block (block 0) are not in it")
_TOUCH_HINT = ("skip the null block (block 0: never in the free queue, its ref_cnt is not kept); a free block "
               "(ref_cnt 0) leaves the free queue; every other touched block gets one more reference")


def _touch_hint(before: dict[str, Any], ids: list[int], expected: dict[str, Any], got: dict[str, Any]) -> str:
    """The rule of touch that this result breaks."""
    if 0 in ids and got["ref_cnts"][0] != expected["ref_cnts"][0]:
        return ("skip the null block (block 0): it is never in the free queue and its ref_cnt is not kept (it "
                "stands in for skipped blocks in many block tables at once)")
    still_free = [i for i in ids if i and before["ref_cnts"][i] == 0 and i in got["free_queue"]]
    if still_free:
        return (f"a free block (ref_cnt 0) leaves the free queue when touched: block {still_free[0]} is still "
                f"there, so a later allocation would hand it out while this request reads it")
    wrong_count = [i for i in ids if i and got["ref_cnts"][i] != expected["ref_cnts"][i]]
    if wrong_count:
        block_id = wrong_count[0]
        return (f"every touched block gets one more reference: block {block_id} had ref_cnt "
                f"{before['ref_cnts'][block_id]} before, so {expected['ref_cnts'][block_id]} after (each request "
                f"that holds it frees it once)")
    return _TOUCH_HINT


@graded
def check_touch(candidate: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    for seed in seeds:
        rng = random.Random(seed)
        num_blocks = rng.randint(3, 10)
        reference, pool = BlockPool(num_blocks, enable_caching=True), BlockPool(num_blocks, enable_caching=True)
        pool.touch = types.MethodType(candidate, pool)
        history: list[str] = []
        for _ in range(12):
            free_ids = reference.free_block_ids()
            used_ids = [b.block_id for b in reference.blocks[1:] if b.ref_cnt > 0]
            op = rng.choice(["new", "free", "touch", "touch"])
            if op == "new" and free_ids:
                count = rng.randint(1, len(free_ids))
                reference.get_new_blocks(count)
                pool.get_new_blocks(count)
                history.append(f"get_new_blocks({count})")
                continue
            if op == "free" and used_ids:
                ids = rng.sample(used_ids, rng.randint(1, len(used_ids)))
                reference.free_blocks([reference.blocks[i] for i in ids])
                pool.free_blocks([pool.blocks[i] for i in ids])
                history.append(f"free_blocks({ids})")
                continue
            candidates = free_ids + used_ids
            if not candidates:
                continue
            ids = rng.sample(candidates, rng.randint(1, len(candidates)))
            if rng.random() < 0.3:  # a block table may hold the null block (vLLM: skipped blocks)
                ids.insert(rng.randint(0, len(ids)), 0)
            inputs = {"operations so far": list(history), "state before": _state(reference), "touch": ids}
            reference.touch([reference.blocks[i] for i in ids])
            with calling("touch", inputs, hint=_TOUCH_RAISED_HINT):
                pool.touch([pool.blocks[i] for i in ids])
            expect_equal("pool after touch (ref_cnts of blocks 0, 1, ...; the free queue)", inputs, _state(reference),
                         _state(pool), _touch_hint(inputs["state before"], ids, _state(reference), _state(pool)))
            history.append(f"touch({ids})")
            num_cases += 1
    pool = BlockPool(4, enable_caching=True)
    pool.touch = types.MethodType(candidate, pool)
    inputs = {"operations so far": [], "touch": [0], "state before": _state(pool)}
    with calling("touch", inputs, hint=_TOUCH_RAISED_HINT):
        pool.touch([pool.null_block])
    expect_equal("pool after touching only the null block", inputs, {"ref_cnts": [0, 0, 0, 0], "free_queue": [1, 2, 3]},
                 _state(pool), _TOUCH_HINT)
    passed("check_touch", num_cases + 1)


PHASE = Phase("10_prefix_caching", (
    Exercise("hash_block_tokens", check_hash_block_tokens, points=1, grade_id="test-hash-block-tokens",
             part="hash_block_tokens"),
    Exercise("hash_request_tokens", check_hash_request_tokens, points=2, grade_id="test-hash-request-tokens",
             part="hash_request_tokens"),
    Exercise("cache_full_blocks", check_cache_full_blocks, points=4, grade_id="test-cache-full-blocks",
             part="cache_full_blocks"),
    Exercise("get_computed_blocks", check_get_computed_blocks, points=3, grade_id="test-get-computed-blocks",
             part="get_computed_blocks",
             design="the hit rule: how many leading cached blocks a new or resumed request may reuse, derived "
                    "from why its last token must be computed and from a table of traced lookups"),
    Exercise("touch", check_touch, points=1, grade_id="test-touch", part="touch"),
    Exercise("_maybe_evict_cached_block", check_maybe_evict_cached_block, points=4,
             grade_id="test-maybe-evict-cached-block", part="_maybe_evict_cached_block"),
))
