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
20 tokens in scattered blocks, 2 KV heads, 2 query heads per KV head, head_size 16. The other fixed cases
(FIXED_CASES) add, one step at a time, what an engine really hands the kernels: 3 KV heads (SmolLM2's), block
sizes 12 and 6, a scale other than head_size ** -0.5, key and value as views of different buffers with
different strides, a last dimension that is not contiguous, metadata that are prefixes of persistent buffers
with stale tails (so a grid or a read past their end fails cleanly instead of crashing), -1 slots mid-batch,
padding rows, prefill requests in a mixed batch, float16 and bfloat16. The decode checks free a few
inf-filled tensors of the output's size before each call, so an output allocated with torch.empty shows
garbage where nothing was written, not zeros by chance.

vLLM v0.33.0's counterparts are Triton kernels with their own signatures: `reshape_and_cache_kernel_flash`
(vllm/v1/attention/ops/triton_reshape_and_cache_flash.py), launched on the two sides of mini's cache, passes
check_store_kv (tests/course/vllm_answers/test_p07.py; its inputs are packed first where their last dimension
is strided, which vLLM's callers never pass and mini's store_kv accepts); `kernel_unified_attention` (the online
softmax is inline there, no function of its own) is too entangled with vLLM's platform code to launch here.
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


def _state_shape_problem(got: Any, group: int, dim: int) -> str | None:
    """Why `got` is not a state (new_max [G], new_sum [G], new_acc [G, D]) of float tensors; None when it is."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        kinds = ([type(t).__name__ for t in got] if isinstance(got, (tuple, list)) else type(got).__name__)
        return f"it must return (new_max, new_sum, new_acc), three tensors; got {kinds}"
    for what, value, shape in zip(("new_max", "new_sum", "new_acc"), got, ((group,), (group,), (group, dim)),
                                  strict=False):
        if tuple(value.shape) != shape:
            return (f"{what} has shape {list(value.shape)}, expected {list(shape)}: one entry per query row"
                    f"{' and value dimension' if what == 'new_acc' else ''} (a reduction over the tile keeps "
                    "one value per row: no keepdim, no reduction over the rows)")
        if not value.is_floating_point():
            return f"{what} has dtype {value.dtype}; the state is floating point"
    return None


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
            problem = _state_shape_problem(got, group, dim)
            if problem is not None:
                raise AssertionError(f"online_softmax_update: {problem}\n  inputs: {inputs}")
            got = tuple(t.detach().float().cpu() for t in got)
            tile_index = start // tile
            for what, expected, value in zip(("new_max", "new_sum", "new_acc"), state, got, strict=False):
                if torch.allclose(expected, value, rtol=1e-5, atol=1e-5, equal_nan=True):
                    continue
                rows = value.reshape(group, -1)
                nan_rows = torch.isnan(rows).any(1)
                if nan_rows.any() and not torch.isneginf(state[0][nan_rows]).all():
                    hint = ("nan in a row that has real scores: what was summed before this tile must be scaled by a "
                            "factor that is 0 on the first tile (old max -inf) and <= 1 afterwards, and the exps of "
                            "this tile must stay finite; inf * 0 and inf - inf are nan")
                elif torch.isinf(value).any() and what != "new_max":
                    hint = ("inf: an exp of a large positive number. Every exp is taken against a max that is at "
                            "least every score it covers (this tile's included), so each term is <= 1")
                elif nan_rows.any():
                    hint = ("nan in a row whose scores are all -inf so far (masked): such a row has max -inf, and "
                            "exp(-inf - (-inf)) is nan; it must keep max -inf, sum 0 and acc 0")
                elif what == "new_max" and torch.equal(value, torch.full_like(value, float(value.max()))) \
                        and group > 1 \
                        and not torch.equal(expected, torch.full_like(expected, float(expected.max()))):
                    hint = ("every row got the same max: the max is taken per query row (over the tile's columns), "
                            "never across rows")
                elif what == "new_max":
                    hint = ("the running max of a row is the largest score that row has seen so far, in any tile, "
                            "this one included")
                else:
                    hint = ("the invariant after the fold: sum = the sum of exp(s - new max) over EVERY score seen "
                            "so far, acc the same with the value rows; what was folded before this tile was "
                            "measured against the old max")
                    if tile_index == 0:
                        hint += " (this is the first tile: the old max is -inf and the old sum and acc are 0)"
                expect_equal(f"online_softmax_update(...) {what} after tile {tile_index} (score columns "
                             f"{start}..{min(start + tile, scores.shape[1]) - 1})", inputs, expected.tolist(),
                             value.tolist(), hint,
                             equal=lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5,
                                                               atol=1e-5, equal_nan=True))
            mine = got
        expected_out = torch.softmax(scores, dim=1) @ values
        got_out = mine[2] / mine[1][:, None]
        expect_equal("acc / running_sum after the last tile", {"scores": scores.tolist(), "tile": tile},
                     expected_out.tolist(), got_out.tolist(), "this must be softmax(scores) @ values",
                     equal=lambda a, b: torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-5))
    passed("check_online_softmax_update", len(cases))


# ---------------------------------------------------------------- the paged batches


LAYOUTS = ("packed", "engine", "transposed")


def make_batch(seq_lens: list[int], *, block_size: int, num_kv_heads: int, group_size: int, head_size: int,
               dtype: torch.dtype = torch.float32, num_padding_tokens: int = 0, seed: int = 0,
               query_lens: list[int] | None = None, skipped_tokens: Iterable[int] = (), layout: str = "packed",
               scale: float | None = None) -> dict[str, Any]:
    """One step of a batch whose blocks are scattered over the pool, as a real run leaves them.

    Request r has `seq_lens[r]` tokens in the cache after the step, the last `query_lens[r]` of them new this
    step (default 1: a decode step); its new tokens are flat rows `query_start_loc[r]` onwards. Returns query
    [rows, Hq, D], the new key/value [rows (+2), Hkv, D], a random cache [2, num_blocks, block_size, Hkv, D]
    holding every context, the AttentionMetadata, `block_ids` (each request's blocks) and `scale`. The last
    `num_padding_tokens` rows are padding (slot -1); `skipped_tokens` get slot -1 too, mid-batch.

    `layout` says how the tensors are laid out:
    * "packed": contiguous tensors, metadata exactly as long as the batch (the worked example);
    * "engine": as an engine hands them over. query and key are views of one fused QKV projection output
      (rows of (Hq + 2 Hkv) * D), value a view of another buffer with another row stride; key and value have
      2 rows more than slot_mapping; slot_mapping, query_start_loc, seq_lens and block_table are prefixes of
      longer persistent buffers whose tails hold stale entries of an earlier step (valid slots no token of
      this step owns, the last query_start_loc repeated, seq_len 0, valid block ids);
    * "transposed": "engine", with query and key views whose LAST dimension is not contiguous.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    query_lens = [1] * len(seq_lens) if query_lens is None else list(query_lens)
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_request) + 2  # + the null block 0 + one spare
    free = random.Random(seed).sample(range(1, num_blocks), sum(blocks_per_request))
    block_ids = [[free.pop() for _ in range(n)] for n in blocks_per_request]
    used = {b for ids in block_ids for b in ids}
    spare = next(b for b in range(1, num_blocks) if b not in used)
    width = max(blocks_per_request)
    starts = [0]
    slots = []
    for ids, seq_len, query_len in zip(block_ids, seq_lens, query_lens, strict=False):
        slots += [ids[p // block_size] * block_size + p % block_size for p in range(seq_len - query_len, seq_len)]
        starts.append(starts[-1] + query_len)
    for token in skipped_tokens:
        slots[token] = -1
    slots += [-1] * num_padding_tokens
    rows = len(slots)
    device = _device()
    like = {"device": device, "dtype": dtype}
    num_heads = num_kv_heads * group_size
    persistent = layout != "packed"
    int32 = {"dtype": torch.int32, "device": device}
    # The metadata are prefixes of longer buffers, as an engine's persistent ones are: a kernel that reads past
    # their end reads defined values (in "engine" layouts, stale entries of an earlier step), never wild memory.
    stale = random.Random(seed + 1)
    extra_columns = 2 if persistent else 0
    table = [[stale.randrange(1, num_blocks) if persistent else 0 for _ in range(width + extra_columns)]
             for _ in range(len(seq_lens) + 2)]
    for row, ids in enumerate(block_ids):
        table[row][:len(ids)] = ids
    stale_slots = [spare * block_size + offset for offset in range(min(block_size, 3))] if persistent else [-1] * 3
    query_start_loc = torch.tensor(starts + starts[-1:] * 2, **int32)[:len(starts)]
    seq_lens_tensor = torch.tensor(list(seq_lens) + [0, 0], **int32)[:len(seq_lens)]
    block_table = torch.tensor(table, **int32)[:len(seq_lens)]
    slot_mapping = torch.tensor(slots + stale_slots, dtype=torch.int64, device=device)[:rows]
    metadata = reference.AttentionMetadata(
        num_actual_tokens=starts[-1], query_start_loc=query_start_loc, seq_lens=seq_lens_tensor,
        block_table=block_table, slot_mapping=slot_mapping, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    # The cache sits inside a larger buffer: a buggy kernel writing just outside it (slot -1, say) hits the
    # guard zones, which the checks inspect, instead of corrupting the process's memory.
    shape = (2, num_blocks, block_size, num_kv_heads, head_size)
    numel, guard = math.prod(shape), 2 * block_size * num_kv_heads * head_size
    buffer = torch.randn(numel + 2 * guard, generator=generator).to(**like)
    if not persistent:
        query = torch.randn(rows, num_heads, head_size, generator=generator).to(**like)
        key = torch.randn(rows, num_kv_heads, head_size, generator=generator).to(**like)
        value = torch.randn(rows, num_kv_heads, head_size, generator=generator).to(**like)
    else:
        kv_rows, q_width, kv_width = rows + 2, num_heads * head_size, num_kv_heads * head_size
        fused = torch.randn(kv_rows, q_width + 2 * kv_width, generator=generator).to(**like)
        query = fused[:rows, :q_width].view(rows, num_heads, head_size)
        key = fused[:, q_width:q_width + kv_width].view(kv_rows, num_kv_heads, head_size)
        value = torch.randn(kv_rows, kv_width + 8, generator=generator).to(**like)[:, :kv_width].view(
            kv_rows, num_kv_heads, head_size)
        if layout == "transposed":  # same values, last dimension strided
            query = query.transpose(1, 2).contiguous().transpose(1, 2)
            key = key.transpose(1, 2).contiguous().transpose(1, 2)
    return {
        "query": query,
        "key": key,
        "value": value,
        "kv_cache": buffer[guard:guard + numel].view(shape),
        "metadata": metadata,
        "block_ids": block_ids,
        "query_lens": query_lens,
        "scale": head_size ** -0.5 if scale is None else scale,
        "guards": (buffer[:guard], buffer[guard + numel:], buffer[:guard].clone(), buffer[guard + numel:].clone()),
    }


def _expect_no_write_outside(name: str, batch: dict[str, Any], inputs: dict[str, Any]) -> None:
    __tracebackhide__ = True
    before, after, saved_before, saved_after = batch["guards"]
    if not (torch.equal(before, saved_before) and torch.equal(after, saved_after)):
        side = "before its first" if not torch.equal(before, saved_before) else "after its last"
        raise AssertionError(
            f"{name} wrote OUTSIDE kv_cache, just {side} element\n  inputs:\n"
            + "".join(f"    {key} = {_short_value(value)}\n" for key, value in inputs.items())
            + "  hint: a padding token (slot -1) must store nothing at all, and every lane of a tile that lies "
            "past num_kv_heads or head_size must be masked off (a spill past the cache's last slot lands here)")


def _expect_unchanged(name: str, tensors: dict[str, tuple[torch.Tensor, torch.Tensor]], inputs: dict[str, Any]) -> None:
    __tracebackhide__ = True
    for what, (now, saved) in tensors.items():
        if not torch.equal(now, saved):
            raise AssertionError(f"{name} changed its input `{what}`: inputs are read-only (the engine reuses them)"
                                 f"\n  {first_difference(saved.cpu(), now.cpu())}\n  inputs: {inputs}")


# The phase's cases, simplest first (each fixed case adds what the previous ones did not have).
FIXED_CASES = (
    WORKED_EXAMPLE,
    # SmolLM2-135M's attention shape (3 KV heads, 3 query heads each) and a block size that is no power of two
    {"seq_lens": [7, 26, 13], "block_size": 12, "num_kv_heads": 3, "group_size": 3, "head_size": 24, "scale": 0.3},
    # as the engine hands them over: views of a fused QKV output, stale tails, padding, a -1 slot mid-batch, fp16
    {"seq_lens": [1, 16, 33, 5], "block_size": 16, "num_kv_heads": 1, "group_size": 4, "head_size": 8,
     "num_padding_tokens": 2, "skipped_tokens": [1], "layout": "engine", "dtype": torch.float16, "scale": 0.5},
    # a mixed batch (two prefill chunks among decodes), bf16, query and key whose last dimension is strided
    {"seq_lens": [9, 14, 6, 20], "query_lens": [1, 6, 1, 3], "block_size": 6, "num_kv_heads": 3, "group_size": 2,
     "head_size": 16, "num_padding_tokens": 1, "skipped_tokens": [4], "layout": "transposed",
     "dtype": torch.bfloat16, "scale": 0.25},
)


def _kernel_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    cases = [dict(case) for case in FIXED_CASES]
    for seed in seeds:
        rng = random.Random(seed)
        block_size = rng.choice([4, 6, 12, 16])
        seq_lens = [rng.choice([1, block_size, 2 * block_size, rng.randint(1, 34)]) for _ in range(rng.randint(1, 3))]
        query_lens = [1 if rng.random() < 0.7 else rng.randint(1, min(s, 5)) for s in seq_lens]
        case = {"seq_lens": seq_lens, "block_size": block_size, "num_kv_heads": rng.choice([1, 2, 3]),
                "group_size": rng.choice([1, 2, 3, 4]), "head_size": rng.choice([8, 16, 24]),
                "num_padding_tokens": rng.choice([0, 0, 1]), "seed": seed,
                "dtype": rng.choice([torch.float32, torch.float32, torch.float16, torch.bfloat16]),
                "layout": rng.choice(LAYOUTS), "scale": round(rng.uniform(0.1, 1.0), 3)}
        if any(q != 1 for q in query_lens):
            case["query_lens"] = query_lens
        if sum(query_lens) > 1 and rng.random() < 0.5:
            case["skipped_tokens"] = [rng.randrange(sum(query_lens))]
        cases.append(case)
    return cases


def _describe(case: dict[str, Any], batch: dict[str, Any] | None = None,
              tensors: tuple[str, ...] = ("query",)) -> dict[str, Any]:
    """The case as the learner reads it, with the strides of `tensors` when they are views."""
    shown = {key: value for key, value in case.items() if key != "seed"}
    if "dtype" in shown:
        shown["dtype"] = str(shown["dtype"]).replace("torch.", "")
    if batch is not None and case.get("layout", "packed") != "packed":
        for name in tensors:
            shown[f"{name} strides"] = tuple(batch[name].stride())
    return shown


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


POWER_OF_TWO_HINT = ("tl.arange and tile shapes must have a power-of-two length: pad each tile to the next power of "
                     "two (KV_HEADS_PAD, HEAD_PAD, GROUP_PAD) and mask off the lanes past the real size (3 KV heads "
                     "need a tile of 4 head lanes, one of them masked)")


@contextlib.contextmanager
def _calling_kernel(name: str, inputs: dict[str, Any]) -> Iterator[None]:
    """Like `calling`, but a NotImplementedError raised inside a kernel (which the interpreter wraps in an
    InterpreterError, and the compiler reports as a CompilationError) also means "not implemented yet", and a
    tile that is not a power of two gets its own hint."""
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
        text = str(error)
        if "power of 2" in text and "\n  hint: " in text:
            raise AssertionError(text[:text.rindex("\n  hint: ")] + "\n  hint: " + POWER_OF_TWO_HINT) from None
        raise


# ---------------------------------------------------------------- exercises 2 and 3: store_kv


def _slots_holding(cache_side: torch.Tensor, row: torch.Tensor) -> list[int]:
    """The slots of one side of the cache ([num_blocks, block_size, Hkv, D]) whose content is exactly `row`."""
    flat = cache_side.reshape(-1, row.numel())
    return (flat == row.reshape(1, -1).to(flat.dtype)).all(1).nonzero().flatten().tolist()


def _read_as_packed(tensor: torch.Tensor, token: int) -> torch.Tensor | None:
    """Row `token` of `tensor` read from its storage as if its last dimension were contiguous (None if that
    runs off the storage): what a kernel with no stride for the last dimension loads."""
    rows, heads, dims = tensor.shape
    strides = (tensor.stride(0), tensor.stride(1), 1)
    try:
        return torch.as_strided(tensor, (rows, heads, dims), strides, tensor.storage_offset())[token]
    except RuntimeError:
        return None


# Complex by design: one branch per kernel mistake its feedback names.
def _store_difference(batch: dict[str, Any], before: torch.Tensor, expected: torch.Tensor) -> tuple[str, str] | None:  # noqa: C901
    """None when the cache is right; else (where: the first wrong slot located, hint: the concept it breaks)."""
    cache = batch["kv_cache"]
    _, _, block_size, num_kv_heads, head_size = cache.shape
    wrong = (cache != expected).reshape(2, -1, num_kv_heads * head_size)  # [side, slot, values]
    wrong_slots = wrong.any(-1).any(0).nonzero().flatten().tolist()
    if not wrong_slots:
        return None
    slot_mapping = batch["metadata"].slot_mapping
    num_tokens = slot_mapping.shape[0]
    writers = {s: t for t, s in enumerate(slot_mapping.tolist()) if s >= 0}
    stale = {}  # slot -> index in slot_mapping's buffer, for the stale entries just past its end
    storage = slot_mapping.untyped_storage().nbytes() // slot_mapping.element_size() - slot_mapping.storage_offset()
    if storage > num_tokens:
        tail = torch.as_strided(slot_mapping, (storage,), (1,), slot_mapping.storage_offset())[num_tokens:]
        stale = {s: num_tokens + i for i, s in enumerate(tail.tolist())}
    slot = wrong_slots[0]
    sides = [name for side, name in enumerate(("keys (kv_cache[0])", "values (kv_cache[1])"))
             if wrong[side, slot].any()]
    heads = sorted({i // head_size for i in wrong[:, slot].any(0).nonzero().flatten().tolist()})
    block, offset = divmod(slot, block_size)
    who = (f"token {writers[slot]} (slot_mapping[{writers[slot]}] = {slot}) had to write it" if slot in writers
           else "no token maps to it: it had to stay unchanged")
    where = (f"first wrong slot: {slot} = block {block}, offset {offset} ({who}); wrong in {' and '.join(sides)}, "
             f"KV heads {heads}; {len(wrong_slots)} slot(s) wrong in all: {wrong_slots[:8]}")
    key, value = batch["key"], batch["value"]
    found = []  # what each side of the slot holds now, when it is something recognizable
    packed_read = swapped = False
    if slot in writers:
        token = writers[slot]
        for side, name in enumerate(("kv_cache[0] (keys)", "kv_cache[1] (values)")):
            if not wrong[side, slot].any():
                continue
            now = cache[side, block, offset].reshape(-1)
            source = key if side == 0 else value
            for other, what, tensor in ((0, "the token's key", key), (1, "the token's value", value)):
                if torch.equal(now, tensor[token].to(cache.dtype).reshape(-1)):
                    found.append(f"{name} holds {what}")
                    swapped = swapped or other != side
            packed = _read_as_packed(source, token) if source.stride(-1) != 1 else None
            if packed is not None and torch.equal(now, packed.to(cache.dtype).reshape(-1)):
                packed_read = True
                found.append(f"{name} holds the token's row read as if its last dimension were contiguous")
            if torch.equal(now, before[side, block, offset].reshape(-1)):
                found.append(f"{name} was never written")
        landed = []
        for what, tensor, side in (("key", key, 0), ("value", value, 1)):
            elsewhere = [s for s in _slots_holding(cache[side], tensor[token].to(cache.dtype)) if s != slot]
            if elsewhere:
                landed.append(f"its {what} landed in slot {elsewhere[0]} = block {elsewhere[0] // block_size}, "
                              f"offset {elsewhere[0] % block_size}")
        if landed:
            found.append(f"token {token}: " + ", ".join(landed))
    if found:
        where += "; at that slot " + ", ".join(found)
    strides = f"key strides {tuple(key.stride())}, value strides {tuple(value.stride())}"
    changed = wrong[:, slot].any(0)
    spill = slot not in writers and slot - 1 in writers and bool(changed[0]) and not bool(changed[-1])
    if packed_read:
        hint = (f"the kernel takes no stride for the last dimension, so it assumes that dimension is contiguous; here "
                f"it is not ({strides}): the launcher must hand the kernel tensors it can address")
    elif swapped:
        hint = ("keys go to kv_cache[0] and values to kv_cache[1]: the two sides of the cache are stride_cache_kv "
                "elements apart")
    elif slot not in writers and slot in stale:
        hint = (f"slot {slot} is entry {stale[slot]} of the buffer slot_mapping is a view of, just past its "
                f"{num_tokens} entries (a stale slot of an earlier step): a program ran for a token past the end of "
                f"slot_mapping. key has {key.shape[0]} rows here, slot_mapping {num_tokens}: only slot_mapping's "
                "tokens are stored")
    elif spill:
        hint = (f"slot {slot} sits right after slot {slot - 1} (token {writers[slot - 1]}'s) and only its first "
                f"values changed: token {writers[slot - 1]}'s write ran past its [num_kv_heads, head_size] tile. "
                f"Here num_kv_heads = {num_kv_heads} and head_size = {head_size}: the lanes of the padded tile past "
                "them must be masked off, for the loads and the stores")
    elif slot not in writers:
        hint = ("a write landed in a slot no token owns: check how a slot splits into a block and an offset within "
                "it (addressed with stride_cache_block and stride_cache_slot)"
                + ("" if _is_power_of_two(block_size) else
                   f"; block_size is {block_size} here, not a power of two, so bit tricks do not split a slot"))
    elif len(heads) < num_kv_heads or not changed.all():
        hint = ("part of the token's [num_kv_heads, head_size] tile is wrong: each (head, dim) lane has its own "
                "offset in key/value (their head stride) and in the cache (stride_cache_head), and the mask keeps "
                "exactly the lanes below num_kv_heads and head_size")
    elif len(sides) == 1:
        side = 0 if "keys" in sides[0] else 1
        hint = (f"only the {'keys' if side == 0 else 'values'} are wrong, and they hold something else than the "
                f"token's {'key' if side == 0 else 'value'}: key and value are different views here ({strides}); "
                "address each through its own strides")
    else:
        hint = ("this token's key and value did not reach its slot (where they landed instead is above): find the "
                "block and the offset of slot_mapping[t]; slot -1 is padding and stores nothing"
                + ("" if _is_power_of_two(block_size) else
                   f"; block_size is {block_size} here, not a power of two, so bit tricks do not split a slot"))
    return where, hint


def _check_store(name: str, run: Callable[[dict[str, Any]], None], seeds: Iterable[int]) -> None:
    """`name` is the learner's function or kernel; check_<name without a leading _> is the check."""
    __tracebackhide__ = True
    cases = _kernel_cases(seeds)
    for case in cases:
        case = {key: value for key, value in case.items() if key != "scale"}  # no softmax in a store
        batch = make_batch(**case)
        before = batch["kv_cache"].clone()
        expected = batch["kv_cache"].clone()
        reference.store_kv(batch["key"], batch["value"], expected, batch["metadata"].slot_mapping)
        inputs = {**_describe(case, batch, ("key", "value")), "slot_mapping": batch["metadata"].slot_mapping.tolist(),
                  "kv_cache": f"[2, {batch['kv_cache'].shape[1]} blocks, block_size, num_kv_heads, head_size]"}
        saved = {what: batch[what].clone() for what in ("key", "value")}
        saved["slot_mapping"] = batch["metadata"].slot_mapping.clone()
        with _calling_kernel(name, inputs):
            run(batch)
        _expect_no_write_outside(name, batch, inputs)
        _expect_unchanged(name, {"key": (batch["key"], saved["key"]), "value": (batch["value"], saved["value"]),
                                 "slot_mapping": (batch["metadata"].slot_mapping, saved["slot_mapping"])}, inputs)
        found = _store_difference(batch, before, expected)
        if found is not None:
            where, hint = found
            lines = [f"{name}: the cache differs from the reference after the write", "  inputs:"]
            lines += [f"    {key} = {_short_value(value, 240)}" for key, value in inputs.items()]
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


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
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


def _row_owner(batch: dict[str, Any]) -> list[tuple[int, int, int] | None]:
    """For each output row: (request, index among its new tokens, its number of new tokens), None for padding."""
    owners: list[tuple[int, int, int] | None] = []
    for request, query_len in enumerate(batch["query_lens"]):
        owners += [(request, index, query_len) for index in range(query_len)]
    return owners + [None] * (batch["query"].shape[0] - len(owners))


def _decode_expected(batch: dict[str, Any], scale: float, gqa: str = "grouped") -> torch.Tensor:
    """What paged_decode returns: the attention of each decode request's row, zeros in every other row.
    gqa="interleaved" maps query head q to KV head q % num_kv_heads instead (a diagnosis)."""
    query, kv_cache, metadata = batch["query"].contiguous(), batch["kv_cache"], batch["metadata"]
    if gqa == "interleaved":
        num_kv_heads, num_heads = kv_cache.shape[3], query.shape[1]
        group = num_heads // num_kv_heads
        position = [q % num_kv_heads * group + q // num_kv_heads for q in range(num_heads)]  # of head q, grouped
        order = [position.index(j) for j in range(num_heads)]  # the head at each grouped position
        return _decode_expected({**batch, "query": query[:, order]}, scale)[:, position]
    output = reference.paged_attention(query, kv_cache, metadata, scale)
    for row, owner in enumerate(_row_owner(batch)):
        if owner is None or owner[2] != 1:
            output[row] = 0
    return output


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Boolean mask of the entries within tolerance (NaN and inf are never close unless equal)."""
    got, expected = got.double().cpu(), expected.double().cpu()
    return (got - expected).abs() <= tolerance + tolerance * expected.abs()


def _decode_hint(case: dict[str, Any], batch: dict[str, Any], expected: torch.Tensor, got: torch.Tensor,
                 bad: list[list[int]], reads_wrong: bool | str | None) -> str:
    """The concept the failing outputs point at (the diagnosis uses the pattern of wrong (token, head) pairs)."""
    seq_lens = case["seq_lens"]
    tile_n = DECODE_TILE_N
    owners = _row_owner(batch)
    bad_rows = sorted({row for row, _, _ in bad})
    bad_heads = sorted({head for _, head, _ in bad})
    group = case["group_size"]
    tolerance = TOLERANCE[case.get("dtype", torch.float32)]
    scale = batch["scale"]
    decode_rows = [row for row in bad_rows if owners[row] is not None and owners[row][2] == 1]
    if any(owners[row] is None for row in bad_rows) and not decode_rows:
        row = next(row for row in bad_rows if owners[row] is None)
        held = got[row].double().cpu()
        what = ("inf" if torch.isinf(held).any() else "nan" if torch.isnan(held).any() else "non-zero values")
        return (f"row {row} is a padding row (the batch has {len(owners) - owners.count(None)} real tokens) and "
                f"holds {what}: no program serves it, so the output must hold zeros there, and only what the "
                "launcher allocated can put anything else in it")
    if any(owners[row] is not None and owners[row][2] != 1 for row in bad_rows) and not decode_rows:
        row = next(row for row in bad_rows if owners[row] is not None)
        request, index, query_len = owners[row]
        return (f"row {row} is new token {index} of request {request}, which has {query_len} new tokens this step (a "
                "prefill chunk, not a decode): the decode kernel must write nothing for such a request (the "
                "prefill kernel does it), and its rows stay zero")
    if reads_wrong == "nothing":
        return ("the program that had to compute these rows read nothing: the grid's axis 0 counts requests and axis 1 "
                "KV heads (tl.program_id(0) is the request), and a request whose query length is 1 must be served")
    if torch.isnan(got.double().cpu()).any():
        return ("the output has nan: exp(-inf - (-inf)) or 0 / 0 somewhere; masked positions get score -inf, and "
                "the running max/sum must start at -inf and 0")
    if reads_wrong:
        return ("the program read the wrong cache entries (above): position p of request r lives in the block that "
                "row r of the block table lists for it, at p's offset within that block, KV head h, keys in "
                "kv_cache[0] and values stride_cache_kv further; lanes past seq_len are masked"
                + ("" if _is_power_of_two(case["block_size"]) else
                   f" (block_size is {case['block_size']}: not a power of two)"))
    ok_rows = torch.tensor(decode_rows)
    for other_scale, why in ((1.0, "without the softmax scale"),
                             (case["head_size"] ** -0.5, f"with head_size ** -0.5 = {case['head_size'] ** -0.5:.4f}")):
        if abs(other_scale - scale) > 1e-9 and _close(got[ok_rows], _decode_expected(batch, other_scale)[ok_rows],
                                                       tolerance).all():
            return (f"these are the outputs of the softmax {why}, not with the scale passed ({scale}): multiply the "
                    "scores by the `scale` argument, once")
    if all(not got[row, head].abs().any() for row, head, _ in bad):
        return (f"these output rows were never written: program (r, h) must store all {group} query heads of its "
                f"group, each in its own output row (a GROUP_PAD >= {group} tile, masked to the group's size)")
    if group > 1 and case["num_kv_heads"] > 1 and _close(
            got[ok_rows], _decode_expected(batch, scale, gqa="interleaved")[ok_rows], tolerance).all():
        return (f"these are the outputs of query head q against KV head q % num_kv_heads: the {group} query heads "
                f"that share a KV head are consecutive (a group), so KV head h serves query heads "
                f"{group}h .. {group}h + {group - 1}")
    bad_requests = sorted({owners[row][0] for row in decode_rows})
    if all(seq_lens[r] > tile_n for r in bad_requests) and any(
            seq_lens[r] <= tile_n for r, q in enumerate(batch["query_lens"]) if q == 1):
        return (f"requests within one tile ({tile_n} positions) are right, longer ones wrong: when a tile raises the "
                "running max, what was folded before (the sum AND the acc) must be rescaled (exercise 1's update)")
    num_heads = expected.shape[1]
    heads_of_row = {row: {head for r, head, _ in bad if r == row} for row in decode_rows}
    if group > 1 and all(len(heads) < num_heads for heads in heads_of_row.values()) and len(
            {frozenset(heads) for heads in heads_of_row.values()}) == 1:
        right = sorted(set(range(num_heads)) - set(bad_heads))
        return (f"in every wrong token the same query heads are wrong ({bad_heads}) and the others right "
                f"({right}): the reads are per KV head, so look at which query rows program (r, h) loads and which "
                f"output rows it stores: the {group} query heads of KV head h's group, each its own row")
    if all(seq_lens[r] % tile_n for r in bad_requests):
        return (f"every wrong request ends inside a tile ({tile_n} positions): the lanes past seq_len in the last "
                "tile must get score -inf (masked) before the max and the exp, and load nothing")
    return ("program (request, kv_head) must read positions 0..seq_len-1 of ITS request through the block table, "
            "for every query head of its group, and fold each tile into the online-softmax state")


def _right_when(run: Callable[[dict[str, Any]], Any], case: dict[str, Any], *, contiguous: bool = False,
                float32: bool = False) -> bool:
    """Whether `run` gets the case right once its query is contiguous, or once the case is in float32 (a
    diagnosis: False on any error)."""
    if float32:
        case = {**case, "dtype": torch.float32}
    batch = make_batch(**case)
    if contiguous:
        batch["query"] = batch["query"].contiguous()
    try:
        got = run(batch)
        expected = _decode_expected(batch, batch["scale"])
        return bool(_close(got, expected, TOLERANCE[case.get("dtype", torch.float32)]).all())
    except Exception:  # noqa: BLE001 -- only a diagnosis
        return False


def _poison_allocator(like: torch.Tensor, copies: int = 4) -> None:
    """Free a few tensors of `like`'s size filled with inf: an output allocated without being cleared
    (torch.empty) then very likely shows inf where nothing was written, instead of zeros by chance."""
    if like.device.type == "cpu":
        tensors = [torch.full(like.shape, float("inf"), dtype=like.dtype) for _ in range(copies)]
        del tensors


def _check_decode(name: str, run: Callable[[dict[str, Any]], Any], seeds: Iterable[int]) -> None:
    __tracebackhide__ = True
    cases = _kernel_cases(seeds)
    for case in cases:
        batch = make_batch(**case)
        metadata = batch["metadata"]
        expected = _decode_expected(batch, batch["scale"])
        inputs = {**_describe(case, batch), "scale": batch["scale"], "block_table": metadata.block_table.tolist()}
        saved = {"query": (batch["query"], batch["query"].clone()), "kv_cache": (batch["kv_cache"],
                                                                                batch["kv_cache"].clone())}
        _poison_allocator(expected)
        with _calling_kernel(name, inputs):
            got = run(batch)
        _expect_no_write_outside(name, batch, inputs)
        _expect_unchanged(name, saved, inputs)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
            shape = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{name} must return a new tensor like query: {tuple(expected.shape)} "
                                 f"{expected.dtype}; got {shape}\n  inputs: {inputs}")
        tolerance = TOLERANCE[case.get("dtype", torch.float32)]
        bad = (~_close(got, expected, tolerance)).nonzero().tolist()
        if not bad:
            continue
        owners = _row_owner(batch)
        row, head, _ = bad[0]
        group, block_size = case["group_size"], case["block_size"]
        kv_head = head // group
        lines = [(f"{name}: output of token {row}, query head {head} is wrong (the first of {len(bad)} values "
                  f"off by more than {tolerance}, in (token, head) pairs {sorted({(r, h) for r, h, _ in bad})[:8]})"),
                 "  inputs:"]
        lines += [f"    {key} = {_short_value(value)}" for key, value in inputs.items()]
        reads_wrong: bool | str | None = None
        owner = owners[row]
        if owner is not None and owner[2] == 1:
            request = owner[0]
            seq_len = case["seq_lens"][request]
            table = batch["block_ids"][request]
            lines.append(f"  program (request {request}, kv_head {kv_head}) serves query heads "
                         f"{kv_head * group}..{kv_head * group + group - 1} of token {row}; seq_len {seq_len}: it "
                         f"must read positions 0..{seq_len - 1} in blocks {table} (block_table row {request})")
            reads = _record_reads(run, case)
            if reads is not None:
                must = {(side, table[p // block_size], p % block_size, kv_head)
                        for p in range(seq_len) for side in (0, 1)}
                mine = reads.get((request, kv_head), set())
                reads_wrong = mine != must
                if not mine:
                    lines.append(f"  it read nothing at all: no program ran as (request {request}, kv_head {kv_head}), "
                                 "or it returned before its first load")
                    reads_wrong = "nothing"
                elif reads_wrong:
                    if must - mine:
                        lines.append(f"  it did NOT read: {_reads_line(must - mine, table, block_size)}")
                    if mine - must:
                        lines.append(f"  it read instead: {_reads_line(mine - must, table, block_size)}")
                else:
                    lines.append("  it read exactly those keys and values: the bug is in the arithmetic")
        elif owner is not None:
            lines.append(f"  token {row} belongs to request {owner[0]}, which has {owner[2]} new tokens (a prefill)")
        else:
            lines.append(f"  token {row} is a padding row (there are {len(owners) - owners.count(None)} real tokens)")
        lines.append("  " + first_difference(expected[row, head].cpu().tolist(), got[row, head].cpu().tolist(),
                                             axis_names=("dim",), atol=tolerance, rtol=tolerance).replace("\n", "\n  "))
        dtype = case.get("dtype", torch.float32)
        if batch["query"].stride(-1) != 1 and _right_when(run, case, contiguous=True):
            hint = (f"with the same query made contiguous, the result is right: here query is a view whose last "
                    f"dimension is not contiguous (strides {tuple(batch['query'].stride())}), and the kernel takes no "
                    "stride for that dimension, so the launcher must hand it a tensor it can address")
        elif dtype != torch.float32 and _right_when(run, case, float32=True):
            hint = (f"the same case in float32 is right, in {str(dtype).replace('torch.', '')} it is not: load the "
                    "query, keys and values, then compute the scores, the softmax state and acc in float32; cast "
                    "only the output to out's dtype")
        else:
            hint = _decode_hint(case, batch, expected, got, bad, reads_wrong)
        lines.append("  hint: " + hint)
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
    Exercise("online_softmax_update", check_online_softmax_update, points=2, grade_id="test-online-softmax",
             design="the online-softmax update, derived from the state's invariant alone (rescaling when a tile "
                    "raises the max; a row that has seen only -inf keeps (-inf, 0, 0) without nan)"),
    Exercise("_store_kv_kernel", check_store_kv_kernel, points=2, grade_id="test-store-kernel",
             part="_store_kv_kernel", needs_triton=True, handle_name="kernel_store_kv"),
    Exercise("store_kv", check_store_kv, points=1, grade_id="test-store-kv", part="triton_store_kv", needs_triton=True),
    Exercise("_paged_decode_kernel", check_paged_decode_kernel, points=5, grade_id="test-decode-kernel",
             part="_paged_decode_kernel", needs_triton=True, handle_name="kernel_paged_decode",
             design="one decode program's walk from its (request, KV head) ids: which rows, which cache addresses, "
                    "which lanes are masked, and how tiles fold, so each key and value is read once"),
    Exercise("paged_decode", check_paged_decode, points=1, grade_id="test-paged-decode", part="paged_decode",
             needs_triton=True),
))
