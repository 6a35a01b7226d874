"""Checks for phase 07 (the attention kernel in Triton), against mini.attention.reference.

    check_online_softmax_update(online_softmax_update)   # PyTorch, no Triton needed
    check_store_kv_kernel(_store_kv_kernel)              # your kernel, launched by mini's store_kv
    check_store_kv(store_kv)                             # your launch wrapper (and kernel)
    check_paged_decode_kernel(_paged_decode_kernel)      # your kernel, launched by mini's paged_decode
    check_paged_decode(paged_decode)                     # your launch wrapper (and kernel)

The kernels run natively on a CUDA GPU, otherwise under Triton's interpreter (TRITON_INTERPRET=1, set by
mini.attention.triton_utils before Triton is imported): the interpreter costs milliseconds per program per
loop iteration, so every case is tiny. Without Triton (macOS, Windows, or not installed) the kernel checks
fail with KERNEL_LABS_MESSAGE (`pytest labs/` skips them instead).

Feedback locates the bug: the store checks name the first wrong slot (block, offset, the token that had to
write it, which side holds what); the decode checks name the first wrong (token, query head), the program
(request, KV head) that computes it, the positions and blocks it had to read and, under the interpreter, the
ones it did read (a rerun with tl.load hooked), with a hint picked from the pattern of wrong outputs
(ragged last tile, rescaling across tiles, GQA rows, softmax scale, padding rows).

The first case of each check is the phase's worked example: block_size 4, three requests with 5, 9 and
20 tokens in scattered blocks, 2 KV heads, 2 query heads per KV head, head_size 16.

vLLM v0.33.0's counterparts are Triton kernels with their own signatures: `reshape_and_cache_kernel_flash`
(vllm/v1/attention/ops/triton_reshape_and_cache_flash.py), launched on the two sides of mini's cache, passes
check_store_kv (tests/test_course_vllm_answers_p07.py); `kernel_unified_attention` (the online softmax is
inline there, no function of its own) is too entangled with vLLM's platform code to launch here.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from labs.checks.common import NotImplementedYet, calling, expect_equal, first_difference, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from labs.views import kernel_access
from mini.attention import reference, triton_utils

KERNEL_LABS_MESSAGE = (
    "Phase 07's kernel exercises cannot run on this machine. {reason} In this phase the online-softmax "
    "exercise still works (and the kernel-access view, replayed in PyTorch), and so does every other phase."
)
TRITON_AVAILABLE = triton_utils.is_available()

WORKED_EXAMPLE = {"seq_lens": [5, 9, 20], "block_size": 4, "num_kv_heads": 2, "group_size": 2, "head_size": 16}


def kernel_labs_message() -> str:
    return KERNEL_LABS_MESSAGE.format(reason=triton_utils.unavailable_reason())


def _require_triton():
    """The triton_paged module, or an AssertionError with the platform message."""
    __tracebackhide__ = True
    if not TRITON_AVAILABLE:
        raise AssertionError(kernel_labs_message())
    from mini.attention import triton_paged

    return triton_paged


def _device() -> str:
    return "cuda" if torch.cuda.is_available() and not triton_utils.use_interpreter() else "cpu"


@contextlib.contextmanager
def _calling_kernel(name: str, inputs: dict[str, Any]) -> Iterator[None]:
    """Like `calling`, but a NotImplementedError raised inside a kernel (which the interpreter wraps in an
    InterpreterError, and the compiler reports as a CompilationError) also means "not implemented yet"."""
    __tracebackhide__ = True
    try:
        with calling(name, inputs):
            yield
    except NotImplementedYet:
        raise
    except AssertionError as error:
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, NotImplementedError) or "NotImplementedError" in str(cause):
                raise NotImplementedYet(
                    f"`{name}` is not implemented yet: replace `raise NotImplementedError()` in its answer cell"
                ) from error
            cause = cause.__cause__ or cause.__context__
        raise


# ---------------------------------------------------------------- exercise 1: online softmax


def _softmax_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    """A query group [G, D] against a row of keys split into tiles; masked (-inf) lanes in the last tile."""
    worked = {"scores": torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, 0.5, -1.0, float("-inf")]]),
              "values": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]]), "tile": 2}
    masked_first = {"scores": torch.tensor([[float("-inf"), float("-inf"), 1.0, 2.0], [0.0, 1.0, 2.0, 3.0]]),
                    "values": torch.tensor([[9.0, 9.0], [9.0, 9.0], [1.0, 0.0], [0.0, 1.0]]), "tile": 2}
    cases = [worked, masked_first]
    for seed in seeds:
        rng = random.Random(seed)
        generator = torch.Generator().manual_seed(seed)
        group, length, dim = rng.choice([1, 2, 4]), rng.randint(1, 40), rng.choice([2, 8])
        tile = rng.choice([1, 4, 16])
        scores = torch.randn(group, length, generator=generator) * rng.choice([1.0, 10.0, 100.0])
        padded = -(-length // tile) * tile  # the last tile is ragged: masked lanes are -inf
        scores = torch.cat([scores, torch.full((group, padded - length), float("-inf"))], dim=1)
        values = torch.cat([torch.randn(length, dim, generator=generator), torch.zeros(padded - length, dim)])
        cases.append({"scores": scores, "values": values, "tile": tile})
    return cases


@graded
def check_online_softmax_update(online_softmax_update: Callable, seeds: Iterable[int] = range(10)) -> None:
    cases = _softmax_cases(seeds)
    for case in cases:
        scores, values, tile = case["scores"], case["values"], case["tile"]
        group, dim = scores.shape[0], values.shape[1]
        state = (torch.full((group,), float("-inf")), torch.zeros(group), torch.zeros(group, dim))
        mine = tuple(t.clone() for t in state)
        for start in range(0, scores.shape[1], tile):
            tile_scores, tile_values = scores[:, start:start + tile], values[start:start + tile]
            inputs = {"running_max": mine[0].tolist(), "running_sum": mine[1].tolist(), "acc": mine[2].tolist(),
                      "scores": tile_scores.tolist(), "values": tile_values.tolist()}
            state = kernel_access.online_softmax_update(*state, tile_scores, tile_values)
            with calling("online_softmax_update", inputs):
                got = online_softmax_update(*(t.clone() for t in mine), tile_scores.clone(), tile_values.clone())
            if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
                raise AssertionError(f"online_softmax_update must return (new_max, new_sum, new_acc), three "
                                     f"tensors; got {type(got).__name__}\n  inputs: {inputs}")
            for what, expected, value in zip(("new_max", "new_sum", "new_acc"), state, got):
                nan_rows = torch.isnan(value.reshape(value.shape[0], -1)).any(1) if value.dim() else value.isnan()
                if torch.isnan(value).any() and not torch.isneginf(state[0][nan_rows]).any():
                    hint = ("nan in a row that has real scores: the old sum and acc are rescaled by a factor that "
                            "must be 0 on the first tile (old max -inf) and <= 1 afterwards; inf * 0 is nan")
                elif torch.isnan(value).any():
                    hint = ("nan: a row whose scores are all -inf so far (masked) has max -inf, and exp(-inf - (-inf)) "
                            "is nan; such a row must keep max -inf, sum 0 and acc 0")
                elif what == "new_max":
                    hint = "the running max is the largest score seen so far: the old max or this tile's"
                else:
                    hint = ("what was summed under the old max must be rescaled to the new max (a factor "
                            "exp(old max - new max) <= 1) before this tile's exp(scores - new max) terms are added")
                tile_index = start // tile
                expect_equal(f"online_softmax_update(...) {what} after tile {tile_index} (score columns "
                             f"{start}..{min(start + tile, scores.shape[1]) - 1})", inputs, expected.tolist(),
                             value.tolist(), hint,
                             equal=lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5,
                                                               atol=1e-5))
            mine = tuple(got)
        expected_out = torch.softmax(scores, dim=1) @ values
        got_out = mine[2] / mine[1][:, None]
        expect_equal("acc / running_sum after the last tile", {"scores": scores.tolist(), "tile": tile},
                     expected_out.tolist(), got_out.tolist(), "this must be softmax(scores) @ values",
                     equal=lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-5))
    passed("check_online_softmax_update", len(cases))


# ---------------------------------------------------------------- the paged batches


def make_batch(seq_lens: list[int], *, block_size: int, num_kv_heads: int, group_size: int, head_size: int,
               dtype: torch.dtype = torch.float32, num_padding_tokens: int = 0, seed: int = 0) -> dict[str, Any]:
    """A decode step: every request has one new token (its last position); its blocks are scattered.

    Returns query [B (+ padding), Hq, D], the new key/value [B (+ padding), Hkv, D], a random cache
    [2, num_blocks, block_size, Hkv, D] holding every context, and the AttentionMetadata. Padding rows
    get slot -1.
    """
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_request) + 2  # + the null block 0 + one spare
    free = random.Random(seed).sample(range(1, num_blocks), sum(blocks_per_request))
    block_ids = [[free.pop() for _ in range(n)] for n in blocks_per_request]
    block_table = torch.zeros(len(seq_lens), max(blocks_per_request), dtype=torch.int32)
    for row, ids in enumerate(block_ids):
        block_table[row, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
    slots = [ids[(s - 1) // block_size] * block_size + (s - 1) % block_size for ids, s in zip(block_ids, seq_lens)]
    rows = len(seq_lens) + num_padding_tokens
    device = _device()
    metadata = reference.AttentionMetadata(
        num_actual_tokens=len(seq_lens),
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table.to(device),
        slot_mapping=torch.tensor(slots + [-1] * num_padding_tokens, dtype=torch.int64, device=device),
        max_query_len=1,
        max_seq_len=max(seq_lens),
    )
    like = {"device": device, "dtype": dtype}
    # The cache sits inside a larger buffer: a buggy kernel writing just outside it (slot -1, say) hits the
    # guard zones, which the checks inspect, instead of corrupting the process's memory.
    shape = (2, num_blocks, block_size, num_kv_heads, head_size)
    numel, guard = math.prod(shape), 2 * block_size * num_kv_heads * head_size
    buffer = torch.randn(numel + 2 * guard, generator=generator).to(**like)
    return {
        "query": torch.randn(rows, num_kv_heads * group_size, head_size, generator=generator).to(**like),
        "key": torch.randn(rows, num_kv_heads, head_size, generator=generator).to(**like),
        "value": torch.randn(rows, num_kv_heads, head_size, generator=generator).to(**like),
        "kv_cache": buffer[guard:guard + numel].view(shape),
        "metadata": metadata,
        "block_ids": block_ids,
        "scale": head_size ** -0.5,
        "guards": (buffer[:guard], buffer[guard + numel:], buffer[:guard].clone(), buffer[guard + numel:].clone()),
    }


def _expect_no_write_outside(name: str, batch: dict[str, Any], inputs: dict[str, Any]) -> None:
    __tracebackhide__ = True
    before, after, saved_before, saved_after = batch["guards"]
    if not (torch.equal(before, saved_before) and torch.equal(after, saved_after)):
        raise AssertionError(f"{name} wrote OUTSIDE kv_cache (just before or after it): check the slot -1 "
                             f"(padding) case and your masks\n  inputs: {inputs}")


def _kernel_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    cases = [dict(WORKED_EXAMPLE)]
    cases.append({"seq_lens": [1, 16, 7], "block_size": 16, "num_kv_heads": 1, "group_size": 4, "head_size": 8,
                  "num_padding_tokens": 2})
    cases.append({"seq_lens": [12, 3], "block_size": 4, "num_kv_heads": 2, "group_size": 3, "head_size": 32,
                  "dtype": torch.float16})
    for seed in seeds:
        rng = random.Random(seed)
        block_size = rng.choice([4, 16])
        seq_lens = [rng.choice([1, block_size, 2 * block_size, rng.randint(1, 34)]) for _ in range(rng.randint(1, 3))]
        cases.append({"seq_lens": seq_lens, "block_size": block_size, "num_kv_heads": rng.choice([1, 2]),
                      "group_size": rng.choice([1, 2, 4]), "head_size": rng.choice([8, 16, 24]),
                      "num_padding_tokens": rng.choice([0, 0, 1]), "seed": seed,
                      "dtype": rng.choice([torch.float32, torch.float32, torch.float16])})
    return cases


def _describe(case: dict[str, Any]) -> dict[str, Any]:
    shown = {key: value for key, value in case.items() if key != "seed"}
    if "dtype" in shown:
        shown["dtype"] = str(shown["dtype"]).replace("torch.", "")
    return shown


# ---------------------------------------------------------------- exercises 2 and 3: store_kv


def _store_difference(batch: dict[str, Any], before: torch.Tensor, expected: torch.Tensor) -> tuple[str, str] | None:
    """None when the cache is right; else (where: the first wrong slot located, hint: the concept it breaks)."""
    cache = batch["kv_cache"]
    _, _, block_size, num_kv_heads, head_size = cache.shape
    wrong = (cache != expected).reshape(2, -1, num_kv_heads * head_size)  # [side, slot, values]
    wrong_slots = wrong.any(-1).any(0).nonzero().flatten().tolist()
    if not wrong_slots:
        return None
    slot_mapping = batch["metadata"].slot_mapping.tolist()
    writers = {s: t for t, s in enumerate(slot_mapping) if s >= 0}
    slot = wrong_slots[0]
    sides = [name for side, name in enumerate(("keys (kv_cache[0])", "values (kv_cache[1])"))
             if wrong[side, slot].any()]
    heads = sorted({i // head_size for i in wrong[:, slot].any(0).nonzero().flatten().tolist()})
    block, offset = divmod(slot, block_size)
    who = (f"token {writers[slot]} (slot_mapping[{writers[slot]}] = {slot}) had to write it" if slot in writers
           else "no token maps to it: it had to stay unchanged")
    where = (f"first wrong slot: {slot} = block {block}, offset {offset} ({who}); wrong in {' and '.join(sides)}, "
             f"KV heads {heads}; {len(wrong_slots)} slot(s) wrong in all: {wrong_slots[:8]}")
    found = []  # what each side of the slot holds now, when it is something recognizable
    if slot in writers:
        token = writers[slot]
        for side, name in enumerate(("kv_cache[0] (keys)", "kv_cache[1] (values)")):
            now = cache[side, block, offset].reshape(-1)
            for what, tensor in (("the token's key", batch["key"]), ("the token's value", batch["value"])):
                if torch.equal(now, tensor[token].to(cache.dtype).reshape(-1)) and not torch.equal(
                        now, expected[side, block, offset].reshape(-1)):
                    found.append(f"{name} holds {what}")
            if torch.equal(now, before[side, block, offset].reshape(-1)) and wrong[side, slot].any():
                found.append(f"{name} was never written")
    if found:
        where += "; at that slot " + ", ".join(found)
    if any("holds" in f for f in found):
        hint = ("keys go to kv_cache[0] and values to kv_cache[1]: the two sides of the cache are stride_cache_kv "
                "elements apart")
    elif slot not in writers:
        hint = ("a write landed in a slot no token owns: slot s is block s // block_size, offset s % block_size "
                "(addressed with stride_cache_block and stride_cache_slot)")
    elif len(heads) < num_kv_heads or not wrong[:, slot].any(0).all():
        hint = ("part of the token's [num_kv_heads, head_size] tile is wrong: the offsets head * stride_head + dim "
                "and the mask head < num_kv_heads & dim < head_size")
    elif len(sides) == 1:
        hint = ("keys go to kv_cache[0] and values to kv_cache[1]: the two sides are stride_cache_kv apart; "
                "the other side of this slot is right")
    else:
        hint = ("this token's key and value did not reach its slot: slot s is block s // block_size, offset "
                "s % block_size; slot -1 is padding and stores nothing")
    return where, hint


def _check_store(name: str, run: Callable[[dict[str, Any]], None], seeds: Iterable[int]) -> None:
    """`name` is the learner's function or kernel; check_<name without a leading _> is the check."""
    __tracebackhide__ = True
    cases = _kernel_cases(seeds)
    for case in cases:
        batch = make_batch(**case)
        before = batch["kv_cache"].clone()
        expected = batch["kv_cache"].clone()
        reference.store_kv(batch["key"], batch["value"], expected, batch["metadata"].slot_mapping)
        inputs = {**_describe(case), "slot_mapping": batch["metadata"].slot_mapping.tolist(),
                  "kv_cache": f"[2, {batch['kv_cache'].shape[1]} blocks, block_size, num_kv_heads, head_size]"}
        with _calling_kernel(name, inputs):
            run(batch)
        _expect_no_write_outside(name, batch, inputs)
        found = _store_difference(batch, before, expected)
        if found is not None:
            where, hint = found
            lines = [f"{name}: the cache differs from the reference after the write", "  inputs:"]
            lines += [f"    {key} = {value}" for key, value in inputs.items()]
            lines += [f"  {where}", f"  hint: {hint}"]
            raise AssertionError("\n".join(lines))
    passed(f"check_{name.lstrip('_')}", len(cases))


@graded
def check_store_kv_kernel(_store_kv_kernel: Any, seeds: Iterable[int] = range(6)) -> None:
    """Your kernel, launched exactly as mini.attention.triton_paged.store_kv launches its own (the engine's
    Triton backend passes its kernel the same way, as `store_kv`'s `_store_kv_kernel` argument)."""
    __tracebackhide__ = True
    triton_paged = _require_triton()

    def run(batch: dict[str, Any]) -> None:
        triton_paged.store_kv(batch["key"], batch["value"], batch["kv_cache"], batch["metadata"].slot_mapping,
                              _store_kv_kernel=_store_kv_kernel)

    _check_store("_store_kv_kernel", run, seeds)


@graded
def check_store_kv(store_kv: Callable, seeds: Iterable[int] = range(6)) -> None:
    """Your launch wrapper: store_kv(key, value, kv_cache, slot_mapping) -> None, writing in place."""
    __tracebackhide__ = True
    _require_triton()

    def run(batch: dict[str, Any]) -> None:
        store_kv(batch["key"], batch["value"], batch["kv_cache"], batch["metadata"].slot_mapping)

    _check_store("store_kv", run, seeds)


# ---------------------------------------------------------------- exercises 4 and 5: paged decode


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
DECODE_TILE_N = 16  # the TILE_N that mini's paged_decode (and the exercise's launcher) passes


def _record_reads(run: Callable[[dict[str, Any]], Any], case: dict[str, Any]) -> dict[tuple[int, int], set] | None:
    """Rerun `run` on a fresh copy of the case under the interpreter, hooking tl.load: program (grid id 0, 1) ->
    the cache entries (side, block, offset, kv head) it loaded (masked-in lanes). None on a GPU or on error."""
    if not triton_utils.use_interpreter():
        return None
    batch = make_batch(**case)
    cache = batch["kv_cache"]
    base, item, end = cache.data_ptr(), cache.element_size(), cache.data_ptr() + cache.numel() * cache.element_size()
    strides = cache.stride()
    reads: dict[tuple[int, int], set] = {}

    def on_load(grid_idx: Any, addresses: Any, mask: Any) -> None:
        addresses, mask = addresses.reshape(-1), mask.reshape(-1)
        inside = mask & (addresses >= base) & (addresses < end)
        for address in addresses[inside].tolist():
            element = (address - base) // item
            side, element = divmod(element, strides[0])
            block, element = divmod(element, strides[1])
            offset, element = divmod(element, strides[2])
            head, _ = divmod(element, strides[3])
            reads.setdefault((int(grid_idx[0]), int(grid_idx[1])), set()).add((side, block, offset, head))

    try:
        with kernel_access._recording_loads(on_load):
            run(batch)
    except Exception:  # noqa: BLE001 -- the failure itself was already reported by the first run; this is only a diagnosis
        return None
    return reads


def _reads_line(reads: set, block_table: list[int], block_size: int) -> str:
    """Cache entries read, as 'position p (block b, offset o)' where the block is in the request's table."""
    shown = []
    for side, block, offset, head in sorted(reads, key=lambda r: (r[3], r[0], r[1], r[2]))[:6]:
        position = (f"position {block_table.index(block) * block_size + offset}" if block in block_table
                    else "a block NOT in its table")
        shown.append(f"{'value' if side else 'key'} {position} (block {block}, offset {offset}, KV head {head})")
    return "; ".join(shown) + (f"; ... {len(reads)} in all" if len(reads) > 6 else "")


def _decode_hint(case: dict[str, Any], batch: dict[str, Any], expected: torch.Tensor, got: torch.Tensor,
                 bad: list[list[int]], reads_wrong: bool | None, no_scale: torch.Tensor) -> str:
    """The concept the failing outputs point at (the diagnosis uses the pattern of wrong (token, head) pairs)."""
    seq_lens = case["seq_lens"]
    tile_n = DECODE_TILE_N
    bad_rows = sorted({row for row, _, _ in bad})
    bad_heads = sorted({head for _, head, _ in bad})
    group = case["group_size"]
    if torch.isnan(got.double().cpu()).any():
        return ("the output has nan: exp(-inf - (-inf)) or 0 / 0 somewhere; masked positions get score -inf, and "
                "the running max/sum must start at -inf and 0")
    if any(row >= len(seq_lens) for row in bad_rows):
        return "rows past the last request are padding tokens: no program writes them, they stay zero"
    if reads_wrong:
        return ("the program read the wrong cache entries (above): position p of request r lives in block "
                "block_table[r, p // block_size] at offset p % block_size, KV head h, keys in kv_cache[0] and "
                "values stride_cache_kv further; lanes past seq_len are masked")
    if torch.allclose(got.double().cpu(), no_scale.double().cpu(), atol=1e-4, rtol=1e-3):
        return "these are the outputs of softmax(q . k) without the softmax scale (head_size ** -0.5)"
    if all(not got[row, head].abs().any() for row, head, _ in bad):
        return (f"these output rows were never written: program (r, h) must store all {group} query heads "
                f"h * {group} + g of its group (a GROUP_PAD >= {group} tile, masked to g < {group})")
    if all(seq_lens[row] > tile_n for row in bad_rows) and any(s <= tile_n for s in seq_lens):
        return (f"requests within one tile ({tile_n} positions) are right, longer ones wrong: across tiles the "
                "running sum and acc must be rescaled by exp(old max - new max) (exercise 1's update)")
    if all(seq_lens[row] % tile_n for row in bad_rows):
        return (f"every wrong request ends inside a tile ({tile_n} positions): the lanes past seq_len in the last "
                "tile must get score -inf (masked) before the max and the exp")
    if group > 1 and len({(r, h) for r, h, _ in bad}) > 1 and all(head % group == bad_heads[0] % group for head in bad_heads) and len(bad_heads) < len(
            expected[0]):
        return (f"only query heads with the same index in their group are wrong: program (r, h) serves query heads "
                f"h * {group} + g for g in 0..{group - 1} (GQA), each with its own query row and output row")
    return ("program (request, kv_head) must read positions 0..seq_len-1 of ITS request through the block table, "
            "for every query head kv_head * group + g, and fold each tile into the online-softmax state")


def _check_decode(name: str, run: Callable[[dict[str, Any]], Any], seeds: Iterable[int]) -> None:
    __tracebackhide__ = True
    cases = _kernel_cases(seeds)
    for case in cases:
        batch = make_batch(**case)
        metadata = batch["metadata"]
        expected = reference.paged_attention(batch["query"], batch["kv_cache"], metadata, batch["scale"])
        inputs = {**_describe(case), "block_table": metadata.block_table.tolist()}
        with _calling_kernel(name, inputs):
            got = run(batch)
        _expect_no_write_outside(name, batch, inputs)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{name} must return a tensor like query: {tuple(expected.shape)} "
                                 f"{expected.dtype}; got {shape}\n  inputs: {inputs}")
        tolerance = TOLERANCE[case.get("dtype", torch.float32)]
        error = (got.double().cpu() - expected.double().cpu()).abs()
        bad = (~(error <= tolerance + tolerance * expected.double().cpu().abs())).nonzero().tolist()
        if not bad:
            continue
        row, head, _ = bad[0]
        group, block_size = case["group_size"], case["block_size"]
        kv_head = head // group
        lines = [(f"{name}: output of token {row}, query head {head} is wrong (the first of {len(bad)} values "
                  f"off by more than {tolerance}, in (token, head) pairs {sorted({(r, h) for r, h, _ in bad})[:8]})"),
                 "  inputs:"]
        lines += [f"    {key} = {_short_value(value)}" for key, value in inputs.items()]
        reads_wrong = None
        if row < len(case["seq_lens"]):
            seq_len = case["seq_lens"][row]
            table = batch["block_ids"][row]
            lines.append(f"  program (request {row}, kv_head {kv_head}) serves query heads "
                         f"{kv_head * group}..{kv_head * group + group - 1}; seq_len {seq_len}: it must read "
                         f"positions 0..{seq_len - 1} in blocks {table} (block_table row {row})")
            reads = _record_reads(run, case)
            if reads is not None:
                must = {(side, table[p // block_size], p % block_size, kv_head)
                        for p in range(seq_len) for side in (0, 1)}
                mine = reads.get((row, kv_head), set())
                reads_wrong = mine != must
                if reads_wrong:
                    if must - mine:
                        lines.append(f"  it did NOT read: {_reads_line(must - mine, table, block_size)}")
                    if mine - must:
                        lines.append(f"  it read instead: {_reads_line(mine - must, table, block_size)}")
                else:
                    lines.append("  it read exactly those keys and values: the bug is in the arithmetic")
        else:
            lines.append(f"  token {row} is a padding row (there are {len(case['seq_lens'])} requests)")
        lines.append("  " + first_difference(expected[row, head].cpu().tolist(), got[row, head].cpu().tolist(),
                                             axis_names=("dim",), atol=tolerance, rtol=tolerance).replace("\n", "\n  "))
        no_scale = reference.paged_attention(batch["query"], batch["kv_cache"], metadata, 1.0)
        lines.append("  hint: " + _decode_hint(case, batch, expected, got, bad, reads_wrong, no_scale))
        raise AssertionError("\n".join(lines))
    passed(f"check_{name.lstrip('_')}", len(cases))


def _short_value(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + " ..."


@graded
def check_paged_decode_kernel(_paged_decode_kernel: Any, seeds: Iterable[int] = range(6)) -> None:
    """Your kernel, launched exactly as mini.attention.triton_paged.paged_decode launches its own (as its
    `_paged_decode_kernel` argument, the way the engine's Triton backend passes its kernel)."""
    __tracebackhide__ = True
    triton_paged = _require_triton()

    def run(batch: dict[str, Any]) -> Any:
        return triton_paged.paged_decode(batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"],
                                         _paged_decode_kernel=_paged_decode_kernel)

    _check_decode("_paged_decode_kernel", run, seeds)


@graded
def check_paged_decode(paged_decode: Callable, seeds: Iterable[int] = range(6)) -> None:
    """Your launch wrapper: paged_decode(query, kv_cache, metadata, scale) -> output like query."""
    __tracebackhide__ = True
    _require_triton()

    def run(batch: dict[str, Any]) -> Any:
        return paged_decode(batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"])

    _check_decode("paged_decode", run, seeds)


# ---------------------------------------------------------------- machines without Triton


class _KernelUnavailable:
    """What `@triton.jit` gives without Triton: the cell defines fine; launching explains why it cannot run."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid: Any) -> Callable:
        raise RuntimeError(kernel_labs_message())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(kernel_labs_message())


class _StandInTriton:
    """Just enough of `triton` for the phase's cells to be DEFINED on a machine without Triton."""

    @staticmethod
    def jit(fn: Callable | None = None, **kwargs: Any) -> Any:
        return _KernelUnavailable(fn) if fn is not None else _KernelUnavailable

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    next_power_of_2 = staticmethod(triton_utils.next_power_of_2)


class _StandInLanguage:
    """`tl.constexpr` and friends, evaluated in kernel signatures at definition time: placeholders."""

    def __getattr__(self, name: str) -> Any:
        return None


def stand_in_triton() -> tuple[Any, Any]:
    """(triton, tl) stand-ins for machines without Triton: kernels can be defined, never launched."""
    return _StandInTriton(), _StandInLanguage()


PHASE = Phase("07_attention_kernel", (
    Exercise("online_softmax_update", check_online_softmax_update, points=2, grade_id="test-online-softmax"),
    Exercise("_store_kv_kernel", check_store_kv_kernel, points=2, grade_id="test-store-kernel", part="_store_kv_kernel", needs_triton=True, handle_name="kernel_store_kv"),
    Exercise("store_kv", check_store_kv, points=1, grade_id="test-store-kv", part="triton_store_kv", needs_triton=True),
    Exercise("_paged_decode_kernel", check_paged_decode_kernel, points=5, grade_id="test-decode-kernel", part="_paged_decode_kernel", needs_triton=True, handle_name="kernel_paged_decode"),
    Exercise("paged_decode", check_paged_decode, points=1, grade_id="test-paged-decode", part="paged_decode", needs_triton=True),
))
