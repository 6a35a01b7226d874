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

from labs.checks.common import NotImplementedYet, calling, expect_equal, passed
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
                expect_equal(f"online_softmax_update(...) {what}", inputs, expected.tolist(), value.tolist(),
                             "new_max = max(old max, tile max); rescale the old sum and acc by exp(old max - "
                             "new max), then add exp(scores - new max) (and its product with values); a row "
                             "whose scores are all -inf so far keeps max -inf, sum 0, acc 0 (no nan)",
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


def _check_store(name: str, run: Callable[[dict[str, Any]], None], seeds: Iterable[int]) -> None:
    """`name` is the learner's function or kernel; check_<name without a leading _> is the check."""
    __tracebackhide__ = True
    cases = _kernel_cases(seeds)
    for case in cases:
        batch = make_batch(**case)
        expected = batch["kv_cache"].clone()
        reference.store_kv(batch["key"], batch["value"], expected, batch["metadata"].slot_mapping)
        inputs = {**_describe(case), "slot_mapping": batch["metadata"].slot_mapping.tolist()}
        with _calling_kernel(name, inputs):
            run(batch)
        _expect_no_write_outside(name, batch, inputs)
        written = (batch["kv_cache"] != expected).reshape(2, -1, batch["kv_cache"][0, 0].numel()).any(-1).any(0)
        wrong_slots = written.nonzero().flatten().tolist()
        expect_equal(f"{name}: slots that differ from the reference after the write", inputs, [], wrong_slots,
                     "token t goes to block slot // block_size, offset slot % block_size, keys in "
                     "kv_cache[0] and values in kv_cache[1]; slot -1 is padding: store nothing")
    passed(f"check_{name.lstrip('_')}", len(cases))


def check_store_kv_kernel(_store_kv_kernel: Any, seeds: Iterable[int] = range(6)) -> None:
    """Your kernel, launched exactly as mini.attention.triton_paged.store_kv launches its own (the engine's
    Triton backend passes its kernel the same way, as `store_kv`'s `_store_kv_kernel` argument)."""
    __tracebackhide__ = True
    triton_paged = _require_triton()

    def run(batch: dict[str, Any]) -> None:
        triton_paged.store_kv(batch["key"], batch["value"], batch["kv_cache"], batch["metadata"].slot_mapping,
                              _store_kv_kernel=_store_kv_kernel)

    _check_store("_store_kv_kernel", run, seeds)


def check_store_kv(store_kv: Callable, seeds: Iterable[int] = range(6)) -> None:
    """Your launch wrapper: store_kv(key, value, kv_cache, slot_mapping) -> None, writing in place."""
    __tracebackhide__ = True
    _require_triton()

    def run(batch: dict[str, Any]) -> None:
        store_kv(batch["key"], batch["value"], batch["kv_cache"], batch["metadata"].slot_mapping)

    _check_store("store_kv", run, seeds)


# ---------------------------------------------------------------- exercises 4 and 5: paged decode


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


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
        bad = (error > tolerance + tolerance * expected.double().cpu().abs()).nonzero().tolist()
        if bad:
            row, head, _ = bad[0]
            expect_equal(f"{name}: output of token {row}, query head {head}", inputs,
                         [round(x, 5) for x in expected[row, head].tolist()],
                         [round(x, 5) for x in got[row, head].tolist()],
                         f"{len(bad)} values off by more than {tolerance}. Program (request, kv_head) must read "
                         "positions 0..seq_len-1 of ITS request through the block table, for every query head "
                         "kv_head * group + g; rows of padding tokens stay zero")
    passed(f"check_{name.lstrip('_')}", len(cases))


def check_paged_decode_kernel(_paged_decode_kernel: Any, seeds: Iterable[int] = range(6)) -> None:
    """Your kernel, launched exactly as mini.attention.triton_paged.paged_decode launches its own (as its
    `_paged_decode_kernel` argument, the way the engine's Triton backend passes its kernel)."""
    __tracebackhide__ = True
    triton_paged = _require_triton()

    def run(batch: dict[str, Any]) -> Any:
        return triton_paged.paged_decode(batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"],
                                         _paged_decode_kernel=_paged_decode_kernel)

    _check_decode("_paged_decode_kernel", run, seeds)


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
    Exercise("_store_kv_kernel", check_store_kv_kernel, points=2, grade_id="test-store-kernel", part="_store_kv_kernel", needs_triton=True),
    Exercise("store_kv", check_store_kv, points=1, grade_id="test-store-kv", part="triton_store_kv", needs_triton=True),
    Exercise("_paged_decode_kernel", check_paged_decode_kernel, points=4, grade_id="test-decode-kernel", part="_paged_decode_kernel", needs_triton=True),
    Exercise("paged_decode", check_paged_decode, points=1, grade_id="test-paged-decode", part="paged_decode", needs_triton=True),
))
