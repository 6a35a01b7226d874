"""Checks for phase 15 (the engine across processes), against mini's tensor-parallel layers and engine core.

    check_row_parallel_linear(RowParallelLinear)            vs mini.model.parallel_linear.RowParallelLinear.forward
    check_vocab_parallel_embedding(VocabParallelEmbedding)  vs mini.model.vocab_parallel_embedding.VocabParallelEmbedding.forward
    check_qkv_weight_loader(QKVParallelLinear)              vs mini.model.parallel_linear.QKVParallelLinear.weight_loader
    check_busy_loop(EngineCoreProc)                         vs mini.engine.core_proc.EngineCoreProc._process_input_queue
                                                               and ._process_engine_step
    check_get_core_engine_for_request(get_core_engine_for_request)
                                                            vs mini.engine.dp_routing.get_core_engine_for_request

The layer checks build one layer per rank (the learner's class and the reference, each a subclass of mini's
layer with the learner's method in it), load the same full checkpoint tensors through `weight_loader`, and
run every rank in a FAKE tensor-parallel group (labs/checks/fake_tp_group.py: one thread per rank, mini's
collectives met in-process), so no process or torch.distributed group is started and the cases are
deterministic. They compare each rank's output with the reference's, and the number of collectives each rank
called. The busy-loop check drives the learner's two methods over a scripted input queue (adds, an abort, a
utility call, a shutdown) on a real in-process `EngineCore` of the shipped model, iteration by iteration,
against the reference methods on the same script. The routing check compares the chosen core on fixed and
random load snapshots and over a stream of requests routed by a `DPLoadBalancer`.

vLLM v0.33.0's `RowParallelLinear.forward` (vllm/model_executor/layers/linear.py),
`VocabParallelEmbedding.forward` (vocab_parallel_embedding.py) and
`DPLBAsyncMPClient.get_core_engine_for_request` (vllm/v1/engine/core_client.py) pass these checks, adapted
only in their call shape (tests/test_course_vllm_answers_p15.py, which says why vLLM's
`QKVParallelLinear.weight_loader` and busy-loop methods are not adapted).
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
from labs.checks.grading import graded
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


def _run_row(cls: type, case: tuple, seed: int) -> tuple[list[torch.Tensor], list[dict[str, int]]]:
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
        hint = ("each rank multiplies ITS input slice by ITS weight columns (F.linear(x, self.weight)); the partial "
                "sums are added with ONE tensor_model_parallel_all_reduce (only when reduce_results and tp_size > "
                "1); the bias is added once in total: by rank 0 before the all-reduce (or after it, on every rank)")
        for rank in range(tp):
            if isinstance(got[rank], torch.Tensor) and got[rank].shape == expected[rank].shape and bias and tp > 1:
                extra = (got[rank] - expected[rank]).double()
                if reduce_results and torch.allclose(extra, (tp - 1) * _bias_of(case, seed).expand_as(extra)):
                    hint = (f"your output has the bias {tp} times: every rank added it before the sum. Add it "
                            f"on rank 0 only (or once, after the all-reduce)")
            expect_same(f"RowParallelLinear.forward, rank {rank} of {tp}", inputs, expected[rank], got[rank], hint,
                        axis_names=("token", "output feature"), atol=1e-9, rtol=1e-9)
        mismatch = _counts_line(expected_calls, got_calls)
        if mismatch:
            raise AssertionError(f"RowParallelLinear.forward: {mismatch}\n  inputs: {inputs}\n  hint: {hint}")
    passed("check_row_parallel_linear", len(cases))


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
        with calling("VocabParallelEmbedding.forward", inputs, expected=f"[{len(ids)}, {hidden}] on every rank"):
            got, got_calls = _run_embed(candidate, case, seed)
        hint = ("on each rank: ids outside [self.vocab_start_index, self.vocab_end_index) are out of this shard; "
                "look up (id - vocab_start_index) for the others and 0 for them, ZERO their rows, then "
                "tensor_model_parallel_all_reduce the result (tp_size 1: a plain lookup)")
        for rank in range(tp):
            expect_same(f"VocabParallelEmbedding.forward, rank {rank} of {tp}", inputs, expected[rank][0],
                        got[rank][0], hint, axis_names=("token", "hidden"), atol=1e-12)
            if got[rank][1] != ids:
                raise AssertionError(f"VocabParallelEmbedding.forward changed its input_ids in place on rank {rank}: "
                                     f"{ids} became {got[rank][1]}\n  hint: work on a copy "
                                     f"(input_ids - start makes one; masked_fill_ on input_ids does not)")
        mismatch = _counts_line(expected_calls, got_calls)
        if mismatch:
            raise AssertionError(f"VocabParallelEmbedding.forward: {mismatch}\n  inputs: {inputs}\n  hint: {hint}")
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
            expect_same(f"QKVParallelLinear.weight_loader, weight of rank {rank} of {tp}", inputs,
                        expected[rank]["weight"], got[rank]["weight"], hint, axis_names=("row", "column"))
            if bias:
                expect_same(f"QKVParallelLinear.weight_loader, bias of rank {rank} of {tp}", inputs,
                            expected[rank]["bias"], got[rank]["bias"], hint, axis_names=("row",))
    passed("check_qkv_weight_loader", len(cases))


# ---------------------------------------------------------------- the busy loop's iteration
class _InputQueue(queue.Queue):
    """The busy loop's input queue, refusing to block when blocking would hang the check (or the core)."""

    MAX_EMPTY_POLLS = 1000

    def __init__(self, core: Any) -> None:
        super().__init__()
        self.core = core
        self.empty_polls = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block and self.empty():
            self.empty_polls += 1
            if self.empty_polls > self.MAX_EMPTY_POLLS:
                raise AssertionError(f"the busy loop polled the empty input queue {self.MAX_EMPTY_POLLS} times in "
                                     f"one run: stop draining at the first queue.Empty (return True)")
        if block and self.empty():
            if self.core.has_unfinished_requests():
                raise AssertionError("the busy loop blocked on an empty input queue while the core had requests "
                                     "to run: block (input_queue.get()) only when has_unfinished_requests() is "
                                     "False; otherwise take what is there with get_nowait()")
            raise AssertionError("the busy loop called a blocking input_queue.get() on an empty queue (it would "
                                 "wait forever): after the first message, drain with get_nowait() and stop at "
                                 "queue.Empty")
        return super().get(block, timeout)


def _busy_loop_script(prompt_ids: list[list[int]], tag: str, seed: int | None = None) -> list[list[tuple]]:
    """The fixed script (seed None), or a variant: other lengths for the requests whose timing the script's
    idle iterations do not depend on, and another utility call."""
    from mini.engine import EngineCoreRequest
    from mini.engine.serial_utils import EngineCoreRequestType
    from mini.sampling_params import SamplingParams

    def add(index: int, max_tokens: int) -> tuple:
        request = EngineCoreRequest(request_id=f"{tag}-{index}", prompt=None, prompt_token_ids=prompt_ids[index],
                                    sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                   ignore_eos=True),
                                    eos_token_id=None, arrival_time=0.0)
        return (EngineCoreRequestType.ADD, request)

    abort = (EngineCoreRequestType.ABORT, ([f"{tag}-1"], "FINISHED_ABORTED"))
    rng = random.Random(seed)
    lengths = [5, 6, 2, 1, 8] if seed is None else [5, rng.randint(2, 8), rng.randint(1, 3), rng.randint(1, 3), 8]
    abort4 = (EngineCoreRequestType.ABORT, ([f"{tag}-4"], "FINISHED_ABORTED"))
    method = "get_num_unfinished_requests" if seed is None else rng.choice(["get_num_unfinished_requests", "ping"])
    utility = (EngineCoreRequestType.UTILITY, (7, method, []))
    return [
        [add(0, lengths[0]), add(1, lengths[1])],   # two requests at once: both must be in the first step
        [add(2, lengths[2])],          # one more while the first two run
        [abort, utility],              # an abort and a utility call, in that order
        [],                            # nothing new: step on
        [],                            # the last request finishes: the core is idle after this
        [add(3, lengths[3])],          # the idle core blocks, wakes for a request, runs it
        [add(4, lengths[4]), abort4],           # added and aborted at once: nothing to run, nothing to emit
        ["SHUTDOWN"],                  # the idle core blocks, gets the shutdown: leave the loop
    ]


@functools.lru_cache(maxsize=1)
def _busy_loop_core() -> Any:
    from mini.config import EngineConfig
    from mini.engine.core import EngineCore
    return EngineCore(EngineConfig(max_model_len=64, num_gpu_blocks_override=32, max_num_seqs=4,
                                   enable_prefix_caching=False, skip_tokenizer_init=True))


def _summarize(item: Any) -> Any:
    from mini.engine.serial_utils import EngineCoreOutputs
    if not isinstance(item, EngineCoreOutputs):
        return repr(item)
    if item.utility_output is not None:
        return {"utility": (item.utility_output.call_id, item.utility_output.result,
                            item.utility_output.failure_message)}
    if item.failed_requests:
        return {"failed": sorted(item.failed_requests)}
    return {"outputs": {o.request_id: (list(o.new_token_ids), o.finish_reason) for o in item.outputs}}


def _run_busy_loop(cls: type, tag: str, seed: int | None = None, max_iterations: int = 20
                   ) -> tuple[list[Any], list[str]]:
    from mini.engine import core_proc
    core = _busy_loop_core()
    rng = random.Random(seed)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11, 12], [13, 14]] if seed is None else \
        [[rng.randrange(1, 4000) for _ in range(rng.randint(1, 6))] for _ in range(5)]
    script = _busy_loop_script(prompts, tag, seed)
    proc = cls.__new__(cls)
    proc.engine_core = core
    proc.input_queue = _InputQueue(core)
    proc.output_queue = queue.Queue()
    proc._stop = threading.Event()
    steps, notes = [], []
    try:
        for index in range(min(max_iterations, len(script))):
            arrivals = script[index]
            for item in arrivals:
                proc.input_queue.put(core_proc._SHUTDOWN if item == "SHUTDOWN" else item)
            notes.append(", ".join(a if a == "SHUTDOWN" else f"{a[0].name} {_payload_name(a[1])}" for a in arrivals)
                         or "nothing arrives")
            keep = proc._process_input_queue()
            if keep:
                proc._process_engine_step()
            emitted = []
            while not proc.output_queue.empty():
                emitted.append(_summarize(proc.output_queue.get_nowait()))
            steps.append({"keep running": bool(keep), "left in the input queue": proc.input_queue.qsize(),
                          "emitted": emitted,
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
    return steps, notes


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
    `_process_engine_step`; run over the scripted queue (then one variant per seed), iteration by iteration,
    against the reference."""
    __tracebackhide__ = True
    from mini.engine.core_proc import EngineCoreProc
    num_cases = 0
    for seed in [None, *seeds]:
        expected, notes = _run_busy_loop(EngineCoreProc, "ref", seed)
        with calling("EngineCoreProc._process_input_queue / _process_engine_step",
                     {"script": "adds, an abort, a utility call, idle, a shutdown (see the notes per iteration)",
                      "variant": "the fixed script" if seed is None else f"seed {seed}"}):
            got, _ = _run_busy_loop(candidate, "you", seed)
        expect_same_steps(
            "the busy loop" + ("" if seed is None else f" (script variant, seed {seed})"),
            _strip_tag(expected, "ref"), _strip_tag(got, "you"),
            hint=("_process_input_queue: when the core has nothing to run, BLOCK for one message; then handle "
                  "EVERY queued message (get_nowait until queue.Empty) with self._handle_client_request(kind, "
                  "payload); return False on _SHUTDOWN. _process_engine_step: step only with unfinished requests, "
                  "and put an EngineCoreOutputs on the output queue only when the step produced outputs"),
            context=[f"arrives before this iteration: {note}" for note in _strip_tag(notes, "ref")],
            step_names=[f"iteration {i}" for i in range(max(len(expected), len(got)))])
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
        snapshot = ([list(c) for c in counts], list(inflight))
        expected = reference(counts, inflight, start, clients)
        with calling("get_core_engine_for_request", inputs, expected=expected):
            got = candidate([list(c) for c in counts], list(inflight), start, clients)
        expect_same("get_core_engine_for_request", inputs, expected, got, hint)
        if ([list(c) for c in counts], list(inflight)) != snapshot:
            raise AssertionError("get_core_engine_for_request changed its inputs; it must only choose (the "
                                 "balancer updates the counts)")
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


PHASE = Phase("15_across_processes", (
    Exercise("RowParallelLinear", check_row_parallel_linear, points=3, grade_id="test-row-parallel-linear",
             part="RowParallelLinear"),
    Exercise("VocabParallelEmbedding", check_vocab_parallel_embedding, points=3,
             grade_id="test-vocab-parallel-embedding", part="VocabParallelEmbedding"),
    Exercise("QKVParallelLinear", check_qkv_weight_loader, points=3, grade_id="test-qkv-weight-loader", part=None),
    Exercise("EngineCoreProc", check_busy_loop, points=4, grade_id="test-busy-loop", part=None),
    Exercise("get_core_engine_for_request", check_get_core_engine_for_request, points=2,
             grade_id="test-get-core-engine-for-request", part="get_core_engine_for_request"),
))
