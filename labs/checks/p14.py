"""Checks for phase 14 (the engine across processes), against mini's tensor-parallel layers and engine core.

    check_row_parallel_linear(RowParallelLinear)            vs mini.model.parallel_linear.RowParallelLinear.forward
    check_vocab_parallel_embedding(VocabParallelEmbedding)  vs
    mini.model.vocab_parallel_embedding.VocabParallelEmbedding.forward
    check_qkv_weight_loader(QKVParallelLinear)              vs
    mini.model.parallel_linear.QKVParallelLinear.weight_loader check_busy_loop(EngineCoreProc)
    vs mini.engine.core_proc.EngineCoreProc._process_input_queue
                                                               and ._process_engine_step
    check_get_core_engine_for_request(get_core_engine_for_request)
                                                            vs mini.engine.dp_routing.get_core_engine_for_request

The layer checks build one layer per rank (the learner's class and the reference, each a subclass of mini's
layer with the learner's method in it), load the same full checkpoint tensors through `weight_loader`, and
run every rank in a FAKE tensor-parallel group (labs/checks/fake_tp_group.py: one thread per rank, mini's
collectives met in-process), so no process or torch.distributed group is started and the cases are
deterministic. They compare each rank's output with the reference's, and the number of collectives each rank
called. The busy-loop check drives the learner's two methods over scripted input queues (adds, aborts, a
utility call, idle waits, a chunked prefill, a shutdown while idle and one while busy) on a real in-process
`EngineCore` of the shipped model, iteration by iteration, against the reference methods on the same script.
The routing check compares the chosen core on fixed and random load snapshots and over a stream of requests
routed by a `DPLoadBalancer`.

vLLM v0.33.0's `RowParallelLinear.forward` and `QKVParallelLinear.weight_loader`
(vllm/model_executor/layers/linear.py), `VocabParallelEmbedding.forward` (vocab_parallel_embedding.py) and
`DPLBAsyncMPClient.get_core_engine_for_request` (vllm/v1/engine/core_client.py) pass these checks, adapted
only in their call shape (tests/course/vllm_answers/test_p14.py, which says why vLLM's busy-loop methods are
not adapted: mini's loop is its own, a shutdown message instead of vLLM's shutdown state).

The busy-loop check also enforces three rules turn by turn, each with its own message: an idle core waits for
its next message instead of spinning (turns are counted while nothing has arrived), no EngineCoreOutputs
without outputs goes out (a prefill chunk samples nothing), and nothing is taken from the queue after the
shutdown sentinel. The layer checks name what is wrong where they can tell (the bias counted per rank, a rank
missing it, a token that came out as zeros or as another id's row, the q / k / v block of the first wrong row);
the loader must refuse an unknown shard id with ValueError; the router must leave its input lists untouched.
"""

from __future__ import annotations

import functools
import queue
import random
import threading
from collections.abc import Iterable
from typing import Any

import torch

from labs.checks.common import calling, expect_same, expect_same_steps, passed
from labs.checks.fake_tp_group import run_ranks
from labs.checks.grading import graded, import_engine_stack
from labs.manifest import Exercise, Phase
from mini import roles
from mini.model import parallel_linear, vocab_parallel_embedding

DTYPE = torch.float64


def _counts_line(expected: list[dict[str, int]], got: list[dict[str, int]]) -> str | None:
    if expected == got:
        return None
    return f"collective calls per rank: expected {expected}, got {got}"


# ---------------------------------------------------------------- RowParallelLinear.forward
ROW_CASES = [  # (input_size, output_size, bias, tp_size, num_tokens, reduce_results)
    (8, 6, True, 2, 3, True),
    (8, 6, False, 2, 1, True),
    (12, 5, True, 3, 4, True),
    (6, 4, True, 1, 2, True),
    (8, 6, True, 2, 2, False),
]


def _row_case(seed: int) -> tuple:
    rng = random.Random(seed)
    tp = rng.choice([1, 2, 2, 3, 4])
    return (tp * rng.randint(1, 4), rng.randint(1, 7), rng.random() < 0.7, tp, rng.randint(1, 5),
            rng.random() < 0.85)


class TransposedWeightMethod(parallel_linear.LinearMethodBase):
    """A linear method that keeps no `layer.weight` once loaded, as phase 15's quantized methods keep int8 or 4-bit
    codes instead: here the same float values, stored transposed, so the layer's output is still exact."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight_t = layer.weight.data.t().contiguous()
        del layer.weight
        layer.register_buffer("weight_t", weight_t, persistent=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        output = x @ layer.weight_t
        return output if bias is None else output + bias


STORED_ROW_CASES = [(8, 6, True, 2, 3, True), (6, 4, True, 1, 2, True), (8, 6, True, 2, 2, False)]
STORED_HINT = ("this layer's linear method stores its weight its own way (phase 15's int8 and 4-bit methods keep "
               "codes and scales, no float `weight`): do the local matmul through `self.quant_method.apply(self, "
               "x, bias)`, as mini's and vLLM's RowParallelLinear.forward do, never with `self.weight` directly")


def _run_row(cls: type, case: tuple, seed: int,
             method: parallel_linear.LinearMethodBase | None = None) -> tuple[list[torch.Tensor], list[dict[str, int]]]:
    input_size, output_size, bias, tp, num_tokens, reduce_results = case
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(output_size, input_size, generator=gen, dtype=DTYPE)
    bias_tensor = torch.randn(output_size, generator=gen, dtype=DTYPE)
    x = torch.randn(num_tokens, input_size, generator=gen, dtype=DTYPE)
    per_rank = input_size // tp

    def rank_fn(rank: int) -> torch.Tensor:
        layer = cls(input_size, output_size, bias=bias, reduce_results=reduce_results, tp_rank=rank, tp_size=tp,
                    dtype=DTYPE)
        parallel_linear.RowParallelLinear.weight_loader(layer, layer.weight, weight)
        if bias:
            parallel_linear.RowParallelLinear.weight_loader(layer, layer.bias, bias_tensor)
        if method is not None:
            layer.quant_method = method
            method.process_weights_after_loading(layer)
        with torch.no_grad():
            return layer(x[:, rank * per_rank:(rank + 1) * per_rank].clone())

    return run_ranks(tp, rank_fn)


@graded
def check_row_parallel_linear(candidate: type, seeds: Iterable[int] = range(6)) -> None:
    """`candidate` is a RowParallelLinear subclass with the learner's `forward`."""
    __tracebackhide__ = True
    reference = parallel_linear.RowParallelLinear
    cases = [(case, index) for index, case in enumerate(ROW_CASES)] + [(_row_case(s), 1000 + s) for s in seeds]
    for case, seed in cases:
        input_size, output_size, bias, tp, num_tokens, reduce_results = case
        inputs = {"input_size": input_size, "output_size": output_size, "bias": bias, "tp_size": tp,
                  "x": f"[{num_tokens}, {input_size}] (rank r gets columns r*{input_size // tp}..)",
                  "reduce_results": reduce_results}
        expected, expected_calls = _run_row(reference, case, seed)
        with calling("RowParallelLinear.forward", inputs, expected=f"[{num_tokens}, {output_size}] on every rank"):
            got, got_calls = _run_row(candidate, case, seed)
        hint = ROW_HINT
        for rank in range(tp):
            hint = _row_hint(case, seed, rank, expected[rank], got[rank], got_calls[rank])
            expect_same(f"RowParallelLinear.forward, rank {rank} of {tp}", inputs, expected[rank], got[rank], hint,
                        axis_names=("token", "output feature"), atol=1e-9, rtol=1e-9)
        mismatch = _counts_line(expected_calls, got_calls)
        if mismatch:
            raise AssertionError(f"RowParallelLinear.forward: {mismatch}\n  inputs: {inputs}\n  hint: {hint}")
    method = TransposedWeightMethod()
    for index, case in enumerate(STORED_ROW_CASES):
        input_size, output_size, bias, tp, num_tokens, reduce_results = case
        inputs = {"input_size": input_size, "output_size": output_size, "bias": bias, "tp_size": tp,
                  "reduce_results": reduce_results, "quant_method": "keeps no `weight` (stored transposed)"}
        expected, _ = _run_row(reference, case, 2000 + index, method)
        with calling("RowParallelLinear.forward", inputs, expected=f"[{num_tokens}, {output_size}] on every rank",
                     hint=STORED_HINT):
            got, _ = _run_row(candidate, case, 2000 + index, method)
        for rank in range(tp):
            expect_same(f"RowParallelLinear.forward, rank {rank} of {tp}, a layer whose method keeps no float weight",
                        inputs, expected[rank], got[rank], STORED_HINT, axis_names=("token", "output feature"),
                        atol=1e-9, rtol=1e-9)
    passed("check_row_parallel_linear", len(cases) + len(STORED_ROW_CASES))


ROW_HINT = ("each rank multiplies ITS input slice by ITS weight columns; the partial results are summed with ONE "
            "tensor_model_parallel_all_reduce (when reduce_results and tp_size > 1); the bias counts once in the "
            "sum: rank 0's partial result carries it (the other ranks' do not)")


def _row_hint(case: tuple, seed: int, rank: int, expected: torch.Tensor, got: Any, calls: dict[str, int]) -> str:
    """The rule this rank's result breaks, named where the difference says which (else the general rule)."""
    _, _, bias, tp, _, reduce_results = case
    if tp > 1 and reduce_results and not calls.get("all_reduce"):
        return (f"rank {rank} called no all-reduce: its output is only its own partial product, not the layer's "
                f"output. " + ROW_HINT)
    if tp > 1 and not reduce_results and calls.get("all_reduce"):
        return ("reduce_results is False here: return this rank's partial result, unreduced (the caller reduces "
                "it later, once). " + ROW_HINT)
    if not (bias and isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype):
        return ROW_HINT
    extra = got - expected
    bias_row = _bias_of(case, seed).expand_as(extra)
    if tp > 1 and reduce_results and torch.allclose(extra, (tp - 1) * bias_row):
        return (f"your output has the bias {tp} times: every rank added it before the sum. The bias counts once: "
                f"only rank 0's partial result carries it (or add it once, after the sum, on every rank)")
    if torch.allclose(extra, -bias_row):
        if reduce_results:
            return (f"rank {rank}'s output lacks the bias: after the all-reduce every rank must hold the same full "
                    f"result, bias included. " + ROW_HINT)
        return (f"rank {rank}'s output lacks the bias: with reduce_results=False the partial results must still sum "
                f"to the layer's output once the caller reduces them, so rank 0's partial result carries the bias. "
                + ROW_HINT)
    if not reduce_results and torch.allclose(extra, bias_row):
        return (f"rank {rank}'s partial result has the bias, so the caller's sum would count it more than once: "
                f"only rank 0's carries it. " + ROW_HINT)
    return ROW_HINT


def _bias_of(case: tuple, seed: int) -> torch.Tensor:
    input_size, output_size = case[0], case[1]
    gen = torch.Generator().manual_seed(seed)
    torch.randn(output_size, input_size, generator=gen, dtype=DTYPE)
    return torch.randn(output_size, generator=gen, dtype=DTYPE)


# ---------------------------------------------------------------- VocabParallelEmbedding.forward
EMBED_CASES = [  # (vocab_size, hidden, tp_size, token ids)
    (10, 4, 2, [0, 4, 5, 9, 5, 2]),
    (11, 3, 2, [10, 5, 6, 0, 1]),        # 11 ids over 2 ranks: 6 + 5 rows, the last rank padded
    (10, 3, 3, [0, 3, 4, 7, 8, 9, 9]),   # 4 + 4 + 2 rows
    (7, 2, 1, [6, 0, 3]),
]


def _embed_case(seed: int) -> tuple:
    rng = random.Random(seed)
    vocab, tp = rng.randint(2, 40), rng.choice([1, 2, 3, 4])
    return vocab, rng.randint(1, 6), tp, [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]


def _run_embed(cls: type, case: tuple, seed: int) -> tuple[list[Any], list[dict[str, int]]]:
    vocab, hidden, tp, ids = case
    weight = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)

    def rank_fn(rank: int) -> Any:
        layer = cls(vocab, hidden, tp_rank=rank, tp_size=tp, dtype=DTYPE)
        vocab_parallel_embedding.VocabParallelEmbedding.weight_loader(layer, layer.weight, weight)
        input_ids = torch.tensor(ids, dtype=torch.long)
        with torch.no_grad():
            output = layer(input_ids)
        return output, input_ids.tolist()

    return run_ranks(tp, rank_fn)


EMBED_HINT = ("on each rank, an id outside [self.vocab_start_index, self.vocab_end_index) (start included, end "
              "excluded) has no row here: this rank contributes ZERO for it; an id inside is row (id - start) of "
              "this rank's weight; one tensor_model_parallel_all_reduce sums the ranks' contributions (tp_size 1: "
              "a plain lookup)")
EMBED_RAISE_HINT = ("an IndexError from the lookup means a local row outside [0, rows on this rank): every id outside "
                    "this rank's range [start, end) (end is exclusive) must be replaced by a valid row before the "
                    "lookup, and its result zeroed after it; ids inside become id - start")


def _embed_hint(case: tuple, ranges: list[tuple[int, int]], weight: torch.Tensor, rank: int, expected: Any,
                got: Any, calls: dict[str, int]) -> str:
    """The first token whose vector is wrong, and what it holds instead (zeros, a multiple, another id's row)."""
    vocab, _, tp, ids = case
    if tp > 1 and not calls.get("all_reduce"):
        return (f"rank {rank} called no all-reduce: its output holds only the vectors of its own ids "
                f"{list(ranges[rank])}, zeros for the others. " + EMBED_HINT)
    if not (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape == expected.shape
            and got.dtype == expected.dtype):
        return EMBED_HINT
    for token, token_id in enumerate(ids):
        want, have = expected[token], got[token]
        if torch.allclose(want, have, atol=1e-12, rtol=0):
            continue
        owner = next(r for r, (start, end) in enumerate(ranges) if start <= token_id < end)
        where = f"token {token}, id {token_id}, held by rank {owner} (ids {list(ranges[owner])})"
        if not torch.any(have):
            return f"{where}: its vector came out as zeros: no rank contributed its row. " + EMBED_HINT
        for times in range(2, tp + 1):
            if torch.allclose(have, times * want, atol=1e-9, rtol=0):
                return (f"{where}: its vector came out {times} times over: more than one rank contributed a row for "
                        f"it (zero the rows of ids outside a rank's range). " + EMBED_HINT)
        stray = sum((weight[start] for r, (start, end) in enumerate(ranges) if r != owner and start < end),
                    torch.zeros_like(want))
        if torch.allclose(have - want, stray, atol=1e-9, rtol=0):
            return (f"{where}: its vector has other ranks' rows added to it: the ranks that do not hold id {token_id} "
                    f"contributed a row (their local row 0) instead of ZERO. " + EMBED_HINT)
        matches = [j for j in range(vocab) if torch.allclose(have, weight[j], atol=1e-9, rtol=0)]
        if matches:
            return (f"{where}: its vector is the row of id {matches[0]}: the local row of an id is its offset from "
                    f"this rank's vocab_start_index. " + EMBED_HINT)
        return f"{where}: wrong vector. " + EMBED_HINT
    return EMBED_HINT


@graded
def check_vocab_parallel_embedding(candidate: type, seeds: Iterable[int] = range(6)) -> None:
    """`candidate` is a VocabParallelEmbedding subclass with the learner's `forward`."""
    __tracebackhide__ = True
    reference = vocab_parallel_embedding.VocabParallelEmbedding
    cases = [(case, index) for index, case in enumerate(EMBED_CASES)] + [(_embed_case(s), 1000 + s) for s in seeds]
    for case, seed in cases:
        vocab, hidden, tp, ids = case
        ranges = [vocab_parallel_embedding.vocab_range(vocab, r, tp) for r in range(tp)]
        inputs = {"vocab_size": vocab, "hidden": hidden, "tp_size": tp, "input_ids": ids,
                  "each rank's ids [start, end)": ranges}
        expected, expected_calls = _run_embed(reference, case, seed)
        with calling("VocabParallelEmbedding.forward", inputs, expected=f"[{len(ids)}, {hidden}] on every rank",
                     hint=EMBED_RAISE_HINT):
            got, got_calls = _run_embed(candidate, case, seed)
        weight = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)
        for rank in range(tp):
            hint = _embed_hint(case, ranges, weight, rank, expected[rank][0], got[rank][0], got_calls[rank])
            expect_same(f"VocabParallelEmbedding.forward, rank {rank} of {tp}", inputs, expected[rank][0],
                        got[rank][0], hint, axis_names=("token", "hidden"), atol=1e-12)
            if got[rank][1] != ids:
                raise AssertionError(f"VocabParallelEmbedding.forward changed its input_ids in place on rank {rank}: "
                                     f"{ids} became {got[rank][1]}\n  hint: work on a copy "
                                     f"(input_ids - start makes one; masked_fill_ on input_ids does not)")
        mismatch = _counts_line(expected_calls, got_calls)
        if mismatch:
            raise AssertionError(f"VocabParallelEmbedding.forward: {mismatch}\n  inputs: {inputs}\n"
                                 f"  hint: {EMBED_HINT}")
    passed("check_vocab_parallel_embedding", len(cases))


# ---------------------------------------------------------------- QKVParallelLinear.weight_loader
QKV_HINT = ("shard q, k and v SEPARATELY: q by this rank's query heads (tp_rank), k and v by this rank's KV heads "
            "(self.kv_partition.shard_rank: with fewer KV heads than ranks, `replicas` ranks hold the same head, "
            "replicated), each copied into its own rows of param (offsets from self.split_sizes)")
QKV_CASES = [  # (hidden, head_size, num_heads, num_kv_heads, tp_size, bias)
    (8, 2, 6, 2, 2, False),      # the shipped model's shape: 3 query + 1 KV head per rank
    (6, 2, 4, 2, 2, True),
    (4, 2, 4, 1, 2, True),       # 1 KV head over 2 ranks: replicated
    (6, 3, 4, 2, 4, False),      # 2 KV heads over 4 ranks: each on 2 ranks
    (4, 2, 2, 2, 1, True),
]


def _qkv_case(seed: int) -> tuple:
    rng = random.Random(seed)
    tp = rng.choice([1, 2, 3, 4])
    kv = rng.choice([d for d in (1, 2, 3, 4, 6, 8) if (d % tp == 0 if d >= tp else tp % d == 0)])
    heads = kv * rng.randint(1, 3)
    while heads % tp:
        heads += kv
    return rng.randint(2, 6), rng.randint(1, 3), heads, kv, tp, rng.random() < 0.5


def _load_qkv(cls: type, case: tuple, seed: int) -> list[dict[str, torch.Tensor]]:
    hidden, head_size, heads, kv_heads, tp, bias = case
    gen = torch.Generator().manual_seed(seed)
    full = {"q": torch.randn(heads * head_size, hidden, generator=gen, dtype=DTYPE),
            "k": torch.randn(kv_heads * head_size, hidden, generator=gen, dtype=DTYPE),
            "v": torch.randn(kv_heads * head_size, hidden, generator=gen, dtype=DTYPE)}
    full_bias = {name: torch.randn(t.shape[0], generator=gen, dtype=DTYPE) for name, t in full.items()}
    ranks = []
    for rank in range(tp):
        layer = cls(hidden, head_size, heads, kv_heads, bias=bias, tp_rank=rank, tp_size=tp, dtype=DTYPE)
        with torch.no_grad():
            layer.weight.fill_(float("nan"))
            if bias:
                layer.bias.fill_(float("nan"))
        for name in ("q", "k", "v"):
            with calling("QKVParallelLinear.weight_loader",
                         {"layer": f"rank {rank} of {tp}, {heads} query / {kv_heads} KV heads of size {head_size}",
                          "param": f"weight {tuple(layer.weight.shape)}", "loaded_weight": tuple(full[name].shape),
                          "shard_id": name}, hint=QKV_HINT):
                layer.weight_loader(layer.weight, full[name], name)
                if bias:
                    layer.weight_loader(layer.bias, full_bias[name], name)
        ranks.append({"weight": layer.weight.detach().clone(),
                      "bias": layer.bias.detach().clone() if bias else None})
    return ranks


UNKNOWN_SHARD_IDS = ("o", "qkv")


def _qkv_block_hint(want: torch.Tensor, have: torch.Tensor, blocks: dict[str, tuple[int, int]], part: Any,
                    rank: int) -> str:
    """Which of this rank's q / k / v blocks holds the first wrong row, and what it should hold."""
    if not (isinstance(have, torch.Tensor) and have.shape == want.shape):
        return ""
    wrong = [row for row in range(want.shape[0]) if not torch.equal(want[row], have[row])]
    if not wrong:
        return ""
    row = wrong[0]
    name = next(n for n, (start, end) in blocks.items() if start <= row < end)
    start, end = blocks[name]
    source = (f"this rank's query heads (shard {rank})" if name == "q" else
              f"KV shard {part.shard_rank} of {part.num_shards} of the {name}_proj rows")
    unloaded = " (never written: still NaN)" if torch.isnan(have[row]).any() else ""
    return (f"the first wrong row, row {row}{unloaded}, is in this rank's {name} block (rows [{start}, {end})), which "
            f"holds {source}. ")


def _check_unknown_shard_id(candidate: type, case: tuple, seed: int) -> None:
    """An unknown shard_id must raise ValueError, before anything is written."""
    hidden, head_size, heads, kv_heads, tp, bias = case
    gen = torch.Generator().manual_seed(seed)
    full_q = torch.randn(heads * head_size, hidden, generator=gen, dtype=DTYPE)
    layer = candidate(hidden, head_size, heads, kv_heads, bias=bias, tp_rank=0, tp_size=tp, dtype=DTYPE)
    for shard_id in UNKNOWN_SHARD_IDS:
        with torch.no_grad():
            layer.weight.fill_(float("nan"))
        inputs = {"layer": f"rank 0 of {tp}, {heads} query / {kv_heads} KV heads of size {head_size}",
                  "loaded_weight": f"{tuple(full_q.shape)} (a q_proj-sized tensor)", "shard_id": repr(shard_id)}
        why = ("a shard_id that is not 'q', 'k' or 'v' is a bug in the caller's loading table (a typo, a fused "
               "checkpoint tensor): raise ValueError naming it. Loaded silently, or skipped, it leaves rows of the "
               "matrix wrong or unloaded, and the model runs on garbage without a word")
        try:
            layer.weight_loader(layer.weight, full_q, shard_id)
        except ValueError:
            pass
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - any other error is reported, with what was expected
            raise AssertionError(
                f"QKVParallelLinear.weight_loader(param, loaded_weight, shard_id={shard_id!r}) raised "
                f"{type(error).__name__}: {error} — expected a ValueError\n  inputs: {inputs}\n  hint: {why}"
            ) from None
        else:
            raise AssertionError(
                f"QKVParallelLinear.weight_loader(param, loaded_weight, shard_id={shard_id!r}) returned without an "
                f"error: an unknown shard_id must raise ValueError\n  inputs: {inputs}\n  hint: {why}")
        if not torch.isnan(layer.weight).all():
            raise AssertionError(
                f"QKVParallelLinear.weight_loader(param, loaded_weight, shard_id={shard_id!r}) raised, but only after "
                f"writing into param: refuse an unknown shard_id before copying anything\n  inputs: {inputs}")


@graded
def check_qkv_weight_loader(candidate: type, seeds: Iterable[int] = range(8)) -> None:
    """`candidate` is a QKVParallelLinear subclass with the learner's `weight_loader`."""
    __tracebackhide__ = True
    reference = parallel_linear.QKVParallelLinear
    cases = [(case, index) for index, case in enumerate(QKV_CASES)] + [(_qkv_case(s), 1000 + s) for s in seeds]
    for case, seed in cases:
        hidden, head_size, heads, kv_heads, tp, bias = case
        expected = _load_qkv(reference, case, seed)
        got = _load_qkv(candidate, case, seed)
        for rank in range(tp):
            part = parallel_linear.kv_head_partition(kv_heads, tp, rank)
            q_rows = heads // tp * head_size
            kv_rows = part.num_kv_heads * head_size
            inputs = {"hidden": hidden, "head_size": head_size, "num_heads": heads, "num_kv_heads": kv_heads,
                      "tp_size": tp, "rank": rank,
                      "this rank's rows": f"q rows [0, {q_rows}) = q_proj rows [{rank * q_rows}, "
                                          f"{(rank + 1) * q_rows}); k rows [{q_rows}, {q_rows + kv_rows}) and v rows "
                                          f"[{q_rows + kv_rows}, {q_rows + 2 * kv_rows}) = KV head(s) of shard "
                                          f"{part.shard_rank} of {part.num_shards}"}
            hint = QKV_HINT
            if part.replicas > 1:
                hint += f"; here each KV head is replicated on {part.replicas} ranks"
            blocks = {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows), "v": (q_rows + kv_rows, q_rows + 2 * kv_rows)}
            for name in ("weight", "bias") if bias else ("weight",):
                want, have = expected[rank][name], got[rank][name]
                block_hint = _qkv_block_hint(want, have, blocks, part, rank)
                expect_same(f"QKVParallelLinear.weight_loader, {name} of rank {rank} of {tp}", inputs, want, have,
                            block_hint + hint, axis_names=("row", "column") if name == "weight" else ("row",))
    for case, seed in cases:   # then the refusal of a shard_id that is not q, k or v
        _check_unknown_shard_id(candidate, case, seed)
    passed("check_qkv_weight_loader", len(cases))


# ---------------------------------------------------------------- the busy loop's turn
MAX_IDLE_TURNS = 50      # turns of an idle core with no message yet before the check calls it spinning
BUSY_LOOP_HINT = ("_process_input_queue: with nothing to run, WAIT for one message (a blocking get); then take "
                  "in EVERY message already queued, without waiting, each through self._handle_client_request; "
                  "the shutdown sentinel ends the loop at once (return False, take nothing after it). "
                  "_process_engine_step: step only when there is something to run, and put ONE EngineCoreOutputs "
                  "on the output queue only when the step returned outputs")


class _LoopProblem(AssertionError):
    """A rule of the busy loop broken inside the learner's code (raised by the queue, caught by the driver)."""


class _InputQueue(queue.Queue):
    """The busy loop's input queue, scripted. Messages the script sends `later` arrive only while the loop
    waits in a blocking get on an idle core (as a real message arrives while the core sleeps). It refuses to
    block where blocking would hang (the core running, or nothing left to arrive), counts polls of an empty
    queue, and notes any take after the shutdown sentinel."""

    MAX_EMPTY_POLLS = 1000

    def __init__(self, core: Any) -> None:
        super().__init__()
        self.core = core
        self.later: list[Any] = []
        self.empty_polls = 0
        self.shutdown_taken = False
        self.problem: str | None = None

    def _fail(self, message: str) -> None:
        self.problem = self.problem or message
        raise _LoopProblem(message)

    def arrive_later(self) -> None:
        for item in self.later:
            super().put(item)
        self.later = []

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self.shutdown_taken:
            self._fail("it took from the input queue again AFTER the shutdown sentinel: once the sentinel is "
                       "taken, the loop ends at once (return False); what is queued behind it is not handled")
        if block and self.empty():
            if self.core.has_unfinished_requests():
                self._fail("it blocked on an empty input queue while the core had requests to run (generation "
                           "would stall until the next message): wait only when has_unfinished_requests() is "
                           "False; otherwise take what is there without waiting")
            if not self.later:
                self._fail("it called a blocking input_queue.get() on an empty queue with no message left to "
                           "come (it would wait forever): after the first message, take only what is already "
                           "queued, without waiting, and stop at queue.Empty")
            self.arrive_later()          # the loop waits; the message arrives
        if not block and self.empty():
            self.empty_polls += 1
            if self.empty_polls > self.MAX_EMPTY_POLLS:
                self._fail(f"it polled the empty input queue {self.MAX_EMPTY_POLLS} times in one run: stop taking "
                           f"messages at the first queue.Empty (return True)")
        item = super().get(block=False)  # never really blocks (raises queue.Empty when empty)
        if item is _shutdown_sentinel():
            self.shutdown_taken = True
        return item


def _shutdown_sentinel() -> Any:
    from mini.engine import core_proc
    return core_proc._SHUTDOWN


LONG_PROMPT_LEN = 24     # over the busy-loop core's token budget (16): prefilled in two chunks
BUSY_LOOP_SCRIPTS = ("the fixed script", "shutdown while busy")


def _busy_loop_script(prompt_ids: list[list[int]], tag: str, name: str, seed: int | None = None
                      ) -> list[tuple[list[Any], list[Any]]]:
    """(arrives now, arrives while the loop waits) per iteration. `name` picks the script; a seed varies the
    fixed script's lengths (of the requests whose timing its idle iterations do not depend on), its prompts
    and its utility call."""
    from mini.engine import EngineCoreRequest
    from mini.sampling_params import SamplingParams
    from mini.serial_utils import EngineCoreRequestType

    def add(index: int, max_tokens: int) -> tuple:
        request = EngineCoreRequest(request_id=f"{tag}-{index}", prompt=None, prompt_token_ids=prompt_ids[index],
                                    sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                   ignore_eos=True),
                                    eos_token_id=None, arrival_time=0.0)
        return (EngineCoreRequestType.ADD, request)

    def abort(index: int) -> tuple:
        return (EngineCoreRequestType.ABORT, ([f"{tag}-{index}"], "FINISHED_ABORTED"))

    shutdown = _shutdown_sentinel()
    if name == "shutdown while busy":
        return [
            ([add(0, 4)], []),                  # one request runs
            ([], []),
            ([shutdown, add(1, 2)], []),        # the shutdown, and a request behind it, while the core is busy
        ]
    rng = random.Random(seed)
    lengths = [5, 6, 2, 1] if seed is None else [5, rng.randint(2, 8), rng.randint(1, 3), rng.randint(1, 3)]
    method = "get_num_unfinished_requests" if seed is None else rng.choice(["get_num_unfinished_requests", "ping"])
    utility = (EngineCoreRequestType.UTILITY, (7, method, []))
    return [
        ([add(0, lengths[0]), add(1, lengths[1])], []),   # two requests at once: both in the first step
        ([add(2, lengths[2])], []),         # one more while the first two run
        ([abort(1), utility], []),          # an abort and a utility call, in that order
        ([], []),                           # nothing new: step on
        ([], []),                           # the last request finishes: the core is idle after this
        ([], [add(3, lengths[3])]),         # the idle core waits; a request arrives while it waits
        ([add(4, 8), abort(4)], []),        # added and aborted at once: nothing to run, nothing to emit
        ([add(5, 2)], []),                  # a long prompt: its first prefill chunk samples no token
        ([], []),                           # the last chunk, and the first token
        ([], []),                           # the second token: finished, idle again
        ([], [shutdown, add(6, 2)]),        # the idle core waits; the shutdown arrives, a request behind it
    ]


@functools.lru_cache(maxsize=1)
def _busy_loop_core() -> Any:
    from mini.config import EngineConfig
    from mini.engine.core import EngineCore
    return EngineCore(EngineConfig(max_model_len=64, num_gpu_blocks_override=32, max_num_seqs=4,
                                   max_num_batched_tokens=16, enable_prefix_caching=False,
                                   skip_tokenizer_init=True))


def _summarize(item: Any) -> Any:
    from mini.serial_utils import EngineCoreOutputs
    if not isinstance(item, EngineCoreOutputs):
        return repr(item)
    if item.utility_output is not None:
        return {"utility": (item.utility_output.call_id, item.utility_output.result,
                            item.utility_output.failure_message)}
    if item.failed_requests:
        return {"failed": sorted(item.failed_requests)}
    return {"outputs": {o.request_id: (list(o.new_token_ids), o.finish_reason) for o in item.outputs}}


def _is_empty_outputs(item: Any) -> bool:
    from mini.serial_utils import EngineCoreOutputs
    return (isinstance(item, EngineCoreOutputs) and not item.outputs and item.utility_output is None
            and not item.failed_requests)


def _describe_arrivals(now: list[Any], later: list[Any]) -> str:
    def name(item: Any) -> str:
        if item is _shutdown_sentinel():
            return "SHUTDOWN"
        kind, payload = item
        text = f"{kind.name} {_payload_name(payload)}"
        if hasattr(payload, "prompt_token_ids") and len(payload.prompt_token_ids) >= LONG_PROMPT_LEN:
            text += f" (a {len(payload.prompt_token_ids)}-token prompt: chunked prefill)"
        return text
    parts = []
    if now:
        parts.append(", ".join(name(item) for item in now))
    if later:
        parts.append("nothing queued; while the idle loop waits: " + ", ".join(name(item) for item in later))
    return "; ".join(parts) or "nothing arrives"


# Complex by design: the busy loop's cases.
def _run_busy_loop(cls: type, tag: str, script_name: str = "the fixed script", seed: int | None = None  # noqa: C901
                   ) -> tuple[list[Any], list[str], tuple[int, str] | None]:
    """(one record per iteration, what arrived before each, the first broken rule as (iteration, message))."""
    core = _busy_loop_core()
    rng = random.Random(seed)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11, 12], [13, 14]] if seed is None else \
        [[rng.randrange(1, 4000) for _ in range(rng.randint(1, 6))] for _ in range(5)]
    prompts += [[(7 * i) % 3000 + 1 for i in range(LONG_PROMPT_LEN)], [15, 16]]
    script = _busy_loop_script(prompts, tag, script_name, seed)
    proc = cls.__new__(cls)
    proc.engine_core = core
    proc.input_queue = _InputQueue(core)
    proc.output_queue = queue.Queue()
    proc._stop = threading.Event()
    steps: list[Any] = []
    notes: list[str] = []
    problem: tuple[int, str] | None = None
    try:
        for index, (now, later) in enumerate(script):
            for item in now:
                proc.input_queue.put(item)
            proc.input_queue.later = list(later)
            notes.append(_describe_arrivals(now, later))
            turns, emitted, keep = 0, [], True
            while True:   # the loop's turns in this iteration: one, unless it must wait for a message
                idle = not core.has_unfinished_requests()
                try:
                    keep = proc._process_input_queue()
                    if keep:
                        proc._process_engine_step()
                except _LoopProblem:
                    pass
                turns += 1
                while not proc.output_queue.empty():
                    emitted.append(proc.output_queue.get_nowait())
                if proc.input_queue.problem or not proc.input_queue.later or not keep:
                    break
                if not idle:          # a busy loop does not wait: the message is there for its next turn
                    proc.input_queue.arrive_later()
                elif turns >= MAX_IDLE_TURNS:
                    problem = (index, (f"the loop turned {turns} times while the core had nothing to run and no "
                                      f"message had arrived, and returned each time: it spins (a CPU core burnt "
                                      f"at 100% while idle). With nothing to run, a turn must WAIT for the next "
                                      f"message instead of returning"))
                    break
            if proc.input_queue.problem:
                problem = (index, proc.input_queue.problem)
            elif problem is None and any(_is_empty_outputs(item) for item in emitted):
                problem = (index, ("it put an EngineCoreOutputs with no outputs on the output queue: a step that "
                                  "returned no outputs (a prefill chunk samples no token; an idle core runs no "
                                  "step) must put nothing, or the front end wakes up for an empty message"))
            if problem is not None:
                break
            steps.append({"keep running": bool(keep), "left in the input queue": proc.input_queue.qsize(),
                          "emitted": [_summarize(item) for item in emitted],
                          "unfinished": sorted(core.scheduler.requests) if hasattr(core.scheduler, "requests")
                          else core.get_num_unfinished_requests()})
            if not keep:
                break
    finally:   # leave the shared core empty for the next run
        leftover = list(getattr(core.scheduler, "requests", {}))
        if leftover:
            core.abort_requests(leftover)
        while core.has_unfinished_requests():
            core.step()
    return steps, notes, problem


def _payload_name(payload: Any) -> str:
    if hasattr(payload, "request_id"):
        return payload.request_id.split("-", 1)[1]
    if isinstance(payload, tuple) and payload and isinstance(payload[0], list):
        return str([p.split("-", 1)[1] for p in payload[0]])
    return str(payload[1]) if isinstance(payload, tuple) and len(payload) > 1 else str(payload)


def _strip_tag(steps: list[Any], tag: str) -> list[Any]:
    import json
    return json.loads(json.dumps(steps, default=str).replace(f"{tag}-", "req-"))


@graded
def check_busy_loop(candidate: type, seeds: Iterable[int] = ()) -> None:
    """`candidate` is an EngineCoreProc subclass with the learner's `_process_input_queue` and
    `_process_engine_step`; run over scripted queues (the fixed script, a shutdown while busy, then one variant
    of the fixed script per seed), iteration by iteration, against the reference. Also enforced: no spinning
    while idle, no empty EngineCoreOutputs, nothing taken after the shutdown sentinel."""
    __tracebackhide__ = True
    from mini.engine.core_proc import EngineCoreProc
    num_cases = 0
    runs = [(name, None) for name in BUSY_LOOP_SCRIPTS] + [("the fixed script", seed) for seed in seeds]
    for script_name, seed in runs:
        label = script_name if seed is None else f"{script_name}, variant seed {seed}"
        expected, notes, reference_problem = _run_busy_loop(EngineCoreProc, "ref", script_name, seed)
        assert reference_problem is None, reference_problem
        with calling("EngineCoreProc._process_input_queue / _process_engine_step",
                     {"script": f"{label}: adds, an abort, a utility call, idle waits, a chunked prefill, a "
                                "shutdown (see what arrives before each iteration)"}):
            got, _, problem = _run_busy_loop(candidate, "you", script_name, seed)
        what = f"the busy loop ({label})"
        context = [f"arrives before this iteration: {note}" for note in _strip_tag(notes, "ref")]
        names = [f"iteration {i}" for i in range(max(len(expected), len(got)) + 1)]
        if problem is not None:
            index, message = problem
            expect_same_steps(what, _strip_tag(expected[:index], "ref"), _strip_tag(got[:index], "you"),
                              hint=BUSY_LOOP_HINT, context=context, step_names=names)
            raise AssertionError(f"{what}, iteration {index}: {message}\n  {context[index]}\n"
                                 f"  iterations 0..{index - 1} agree with the reference\n  hint: {BUSY_LOOP_HINT}"
                                 if index else f"{what}, iteration 0: {message}\n  {context[0]}\n"
                                 f"  hint: {BUSY_LOOP_HINT}")
        expect_same_steps(what, _strip_tag(expected, "ref"), _strip_tag(got, "you"), hint=BUSY_LOOP_HINT,
                          context=context, step_names=names)
        num_cases += len(expected)
    passed("check_busy_loop", num_cases)


# ---------------------------------------------------------------- DP routing
ROUTE_CASES = [  # (lb_engines, engine_inflight, eng_start_index, client_count)
    ([[0, 0], [0, 0]], [0, 0], 0, 1),
    ([[0, 0], [0, 0]], [0, 0], 1, 1),                        # a tie goes to the first core the scan reaches
    ([[3, 1], [0, 2], [1, 0]], [0, 0, 0], 0, 1),             # waiting + running: core 2
    ([[0, 0], [0, 0], [0, 0]], [2, 0, 1], 0, 1),             # the in-flight floor: core 1
    ([[0, 1], [0, 0]], [0, 1], 0, 2),                        # client_count scales in-flight: 2 > 1
    ([[2, 0, 0.9], [0, 3, 0.2]], [0, 0], 0, 1),              # KV pressure on waiting: 2 + 2*6*0.4 > 3
    ([[2, 0, 0.4], [0, 3, 0.2]], [0, 0], 1, 1),              # usage <= 0.5: no penalty, 2 < 3
    ([[1, 1], [2, 0], [0, 2]], [0, 0, 0], 2, 1),             # a three-way tie from start 2
]


def _route_case(seed: int) -> tuple:
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    counts = [[rng.randint(0, 3), rng.randint(0, 3)] + ([round(rng.random(), 2)] if rng.random() < 0.5 else [])
              for _ in range(n)]
    return counts, [rng.randint(0, 3) for _ in range(n)], rng.randrange(n), rng.choice([1, 1, 2, 3])


@graded
def check_get_core_engine_for_request(candidate: Any, seeds: Iterable[int] = range(40)) -> None:
    __tracebackhide__ = True
    from mini.engine import dp_routing
    reference = dp_routing.get_core_engine_for_request
    hint = ("score each core as max(client_count * inflight, waiting + running), plus waiting * 6 * "
            "max(0, kv_cache_usage - 0.5) when it has waiting requests; scan from eng_start_index round the "
            "cores and keep the FIRST core with the smallest score (strict <)")
    cases = list(ROUTE_CASES) + [_route_case(s) for s in seeds]
    for counts, inflight, start, clients in cases:
        inputs = {"lb_engines": counts, "engine_inflight": inflight, "eng_start_index": start,
                  "client_count": clients}
        expected = reference([list(c) for c in counts], list(inflight), start, clients)
        arguments = ([list(c) for c in counts], list(inflight))
        with calling("get_core_engine_for_request", inputs, expected=expected):
            got = candidate(arguments[0], arguments[1], start, clients)
        expect_same("get_core_engine_for_request", inputs, expected, got, hint)
        for name, before, after in (("lb_engines", counts, arguments[0]), ("engine_inflight", inflight, arguments[1])):
            if after != before:
                raise AssertionError(
                    f"get_core_engine_for_request changed its inputs: {name} was {before} before the call and is "
                    f"{after} after it\n  inputs: {inputs}\n  hint: it only chooses and returns an index; the "
                    f"lists are the balancer's state (DPLoadBalancer.route bumps the chosen core's waiting count "
                    f"itself, after the call), so a change here is counted twice or leaks into the next choice")
    # A stream of requests through the balancer: its updates (the chosen core's waiting count, the scan start
    # rotating, the in-flight counts) feed the next choice.
    for seed in [0, *seeds][:6]:
        rng = random.Random(seed)
        num_engines = rng.randint(2, 4)
        runs = []
        for function in (reference, candidate):
            balancer_class = roles.with_parts(dp_routing.DPLoadBalancer, {"get_core_engine_for_request": function})
            balancer = balancer_class(num_engines)
            stream_rng = random.Random(seed + 7)
            chosen = []
            for index in range(12):
                if index % 5 == 4:
                    balancer.update_counts([[stream_rng.randint(0, 2), stream_rng.randint(0, 3)]
                                            for _ in range(num_engines)])
                if index % 3 == 2 and balancer.reqs_in_flight:
                    balancer.finished([min(balancer.reqs_in_flight)])
                with calling("get_core_engine_for_request", {"stream of requests": seed, "request": index}):
                    chosen.append(balancer.route(f"r{index}"))
            runs.append(chosen)
        expect_same_steps(f"routing a stream of 12 requests over {num_engines} cores (seed {seed})",
                          [[c] for c in runs[0]], [[c] for c in runs[1]], hint=hint,
                          step_names=[f"request {i}" for i in range(12)])
    passed("check_get_core_engine_for_request", len(cases))


# Imported once in the grading process before it forks a child per check (labs/checks/grading.py).
WARM_UP = (import_engine_stack,)


PHASE = Phase("14_across_processes", (
    Exercise("RowParallelLinear", check_row_parallel_linear, points=3, grade_id="test-row-parallel-linear",
             part="RowParallelLinear"),
    Exercise("VocabParallelEmbedding", check_vocab_parallel_embedding, points=3,
             grade_id="test-vocab-parallel-embedding", part="VocabParallelEmbedding"),
    Exercise("QKVParallelLinear", check_qkv_weight_loader, points=3, grade_id="test-qkv-weight-loader", part=None),
    Exercise("EngineCoreProc", check_busy_loop, points=4, grade_id="test-busy-loop", part=None,
             design="the busy loop's turn: when to wait on the input queue, what to take in, when to step and what "
                    "to emit, derived from five rules (no spinning when idle, no waiting when busy, everything in "
                    "before the step, shutdown at once, one message per productive step)"),
    Exercise("get_core_engine_for_request", check_get_core_engine_for_request, points=2,
             grade_id="test-get-core-engine-for-request", part="get_core_engine_for_request"),
))
