"""Decode steps replayed from CUDA graphs: static input buffers, one captured forward per batch size, padding.

Mirrors vllm/v1/worker/gpu_model_runner.py (`capture_model`, `_dummy_run`: capture the largest size first,
so the smaller graphs reuse its memory pool), vllm/v1/cudagraph_dispatcher.py (`CudagraphDispatcher.dispatch`:
a batch padded up to the next captured size) and vllm/compilation/cuda_graph.py (`CUDAGraphWrapper`: capture
once per size into one shared memory pool, then replay); vllm/config/compilation.py (`cudagraph_mode`,
`cudagraph_capture_sizes`, `max_cudagraph_capture_size`) and `enforce_eager` decide whether and what to capture.

**mini's choice:** a FULL graph of pure decode steps only, one per batch size counted in requests (powers of
two up to `min(max_num_seqs, 512)`, `EngineConfig.cudagraph_capture_sizes`). vLLM v0.33.0's default
`cudagraph_mode` is FULL_AND_PIECEWISE: a full graph for uniform decode batches and piecewise graphs
(attention left outside) for prefill and mixed batches, with capture sizes counted in TOKENS, by default
`[1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_cudagraph_capture_size + 1, 16))` and
`max_cudagraph_capture_size = min(2 x max_num_seqs x (1 + num_speculative_tokens), 512)`
(`VllmConfig._set_cudagraph_sizes` in vllm/config/vllm.py).

Why: a decode step of a small batch is hundreds of tiny kernels, and launching them one by one from Python
costs more than running them. A CUDA graph records the launches once; a replay sends them all with one call.
A replay runs the SAME kernels on the SAME memory with the SAME shapes, so:

* inputs live in static buffers sized for the largest captured batch; each step copies its tensors in;
* a batch of n requests runs the graph of the next captured size >= n, padded: padding tokens get slot -1
  (store_kv skips them), padding requests a zero-length query (query_start_loc stays at n) and seq_len 0
  (the Triton decode kernel returns at once for them), and zeroed block-table rows;
* nothing inside may read a device value into Python (`.tolist()`, `int(t.max())`): the Triton backend is
  written that way, the "torch" / "torch_fast" backends are not, so real graphs need attention_backend
  "triton". AttentionMetadata's Python ints are frozen at capture: max_query_len 1 (decode), max_seq_len
  max_model_len (an upper bound; the Triton decode path does not read it).

Only the hidden states are captured; logits are computed eagerly on `hidden[logits_indices]`, as in vLLM.
Everything else runs eager: prefill and mixed steps, speculative verification, every step of an engine built
with a part of its forward replaced (the `input_preparation`, `model` or `attention` roles of mini/roles.py: a
recorded graph would not see the replacement; decided once, when the runner is built), and everything on a
CPU (as vLLM's CPU backend).

The graph itself is behind a small interface, `capture(fn) -> output` and `replay()`: `CudaGraph` wraps
torch.cuda.CUDAGraph; `EagerReplayGraph` is a teaching and test stand-in that calls `fn` again on replay and
copies the result into the output it returned at capture, so the static buffers and the padding run (and
are tested) on a CPU with any attention backend. `graph_class(device)` picks one; tests patch it.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from mini import roles
from mini.attention.metadata import build_attention_metadata
from mini.utils import cdiv
from mini.worker.prepare_inputs import PreparedInputs

if TYPE_CHECKING:
    from mini.config import EngineConfig

logger = logging.getLogger("mini.worker")

CAPTURABLE_ATTENTION_BACKENDS = ("triton",)  # no host syncs in their decode path
PAD_SLOT_ID = -1  # vLLM's PAD_SLOT_ID: store_kv skips the token


class CudaGraph:
    """One torch.cuda.CUDAGraph: `capture(fn)` records fn's kernels (after one warm-up call), `replay()` reruns them."""

    replays_host_code = False  # a replay runs only the recorded kernels: the forward must be capturable

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None

    @staticmethod
    def new_pool() -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        fn()  # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels, lazy device copies happen
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            output = fn()
        return output

    def replay(self) -> None:
        self.graph.replay()


class EagerReplayGraph:
    """Teaching and test stand-in for `CudaGraph`: replay calls the captured function again, eagerly, and copies
    its result into the output tensor capture returned. No speed-up; the same static-buffer and padding logic."""

    replays_host_code = True  # host code reruns on replay, so any attention backend works

    def __init__(self, pool: Any) -> None:
        self.fn: Callable[[], torch.Tensor] | None = None
        self.output: torch.Tensor | None = None

    @staticmethod
    def new_pool() -> Any:
        return None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fn = fn
        self.output = fn()
        return self.output

    def replay(self) -> None:
        self.output.copy_(self.fn())


def graph_class(device: torch.device) -> type | None:
    """The graph implementation for `device`: `CudaGraph` on CUDA, None (eager) elsewhere.

    Tests patch this to return `EagerReplayGraph`, to run the graph path (buffers, padding) on a CPU."""
    return CudaGraph if device.type == "cuda" else None


def disabled_reason(config: EngineConfig, attention_backend: str, graph_cls: type | None) -> str | None:
    """Why decode must run eager in this engine, or None when graphs can be captured.

    A start-up decision, like `enforce_eager`: an engine whose config replaces a part that runs inside the
    forward (`config.parts`, mini/roles.py) runs eager, since a captured graph would replay the old kernels."""
    replaced_forward_parts = roles.replaced(config, "input_preparation", "model", "attention")
    if config.enforce_eager:
        return "enforce_eager=True"
    if graph_cls is None:
        return f"device {config.device!r} (CUDA graphs need CUDA; the CPU always runs eager, as vLLM's CPU backend)"
    if not graph_cls.replays_host_code and attention_backend not in CAPTURABLE_ATTENTION_BACKENDS:
        return (f"attention_backend {attention_backend!r} syncs with the host (.tolist(), int(t.max())) and cannot "
                f"be captured; graphs need one of {CAPTURABLE_ATTENTION_BACKENDS}")
    if replaced_forward_parts:
        return (f"the engine replaces part(s) of its forward {list(replaced_forward_parts)} (mini/roles.py); "
                "a captured graph would not see the replacement")
    if config.max_model_len is None:
        return "max_model_len is not resolved (the engine resolves it before building the runner)"
    return None


def build_cuda_graph_runner(config: EngineConfig, model: torch.nn.Module, kv_caches: list[torch.Tensor],
                            attention_backend: str) -> CudaGraphRunner | None:
    """Capture the decode graphs now (start-up, vLLM's `compile_or_warm_up_model`), or log why not and return None."""
    device = torch.device(config.device)
    graph_cls = graph_class(device)
    reason = disabled_reason(config, attention_backend, graph_cls)
    if reason is not None:
        logger.info("CUDA graphs off, decode runs eager: %s", reason)
        return None
    runner = CudaGraphRunner(model, kv_caches, config.cudagraph_capture_sizes, int(config.max_model_len),
                             int(config.block_size), device, graph_cls)
    runner.capture()
    return runner


class CudaGraphRunner:
    """Static inputs for the largest captured batch, one graph (and its output) per capture size."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], capture_sizes: Sequence[int],
                 max_model_len: int, block_size: int, device: torch.device | str,
                 graph_cls: type = CudaGraph) -> None:
        self.model = model
        self.kv_caches = kv_caches  # captured by address: never reallocated after capture
        self.capture_sizes = sorted(set(capture_sizes))
        self.max_size = self.capture_sizes[-1]
        self.max_model_len = max_model_len
        self.device = torch.device(device)
        self.graph_cls = graph_cls
        # The static inputs (dtypes as PreparedInputs'); a graph of size s reads their first s rows.
        size, device = self.max_size, self.device
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((size,), PAD_SLOT_ID, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)
        self.query_start_loc = torch.zeros(size + 1, dtype=torch.int32, device=device)
        self.block_table = torch.zeros((size, cdiv(max_model_len, block_size)), dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(size, dtype=torch.int64, device=device)  # decode: row i is request i
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # hidden states [size, H], rewritten by each replay
        self.num_replays = 0
        self.num_padded_replays = 0  # replays whose batch was smaller than the graph's size
        self.capture_seconds = 0.0

    # ------------------------------------------------------------------ start-up
    @torch.inference_mode()
    def capture(self) -> None:
        """One graph per size, largest first, all in one memory pool (a smaller graph reuses the larger's memory)."""
        start = time.perf_counter()
        on_cuda = self.device.type == "cuda"
        free_before = torch.cuda.mem_get_info(self.device)[0] if on_cuda else 0
        # vLLM's `_dummy_run`: every row a one-token decode at position 0 whose context is the null block;
        # slot -1, so nothing is written to the cache.
        self.query_start_loc.copy_(torch.arange(self.max_size + 1, dtype=torch.int32, device=self.device))
        self.seq_lens.fill_(1)
        with torch.cuda.device(self.device) if on_cuda else contextlib.nullcontext():  # cuda:N captures on N
            pool = self.graph_cls.new_pool()
            for size in reversed(self.capture_sizes):
                graph = self.graph_cls(pool)
                self.outputs[size] = graph.capture(functools.partial(self._forward, size))
                self.graphs[size] = graph
        used = 0
        if on_cuda:
            torch.cuda.synchronize(self.device)
            used = free_before - torch.cuda.mem_get_info(self.device)[0]
        self.capture_seconds = time.perf_counter() - start
        logger.info("Capturing CUDA graphs (decode, %s) for batch sizes %s", self.graph_cls.__name__,
                    self.capture_sizes)
        logger.info("Graph capturing finished in %.2f secs, took %.2f GiB", self.capture_seconds, used / 2**30)

    def _forward(self, size: int) -> torch.Tensor:
        """The captured function: the model over the first `size` rows of the static buffers -> hidden [size, H]."""
        inputs = PreparedInputs(
            input_ids=self.input_ids[:size], positions=self.positions[:size],
            query_start_loc=self.query_start_loc[: size + 1], seq_lens=self.seq_lens[:size],
            slot_mapping=self.slot_mapping[:size], block_table=self.block_table[:size],
            logits_indices=self.logits_indices[:size],
        )
        # The maxima are frozen at capture: true of every decode replay (max_seq_len is an upper bound).
        metadata = build_attention_metadata(inputs, max_query_len=1, max_seq_len=self.max_model_len)
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, metadata)

    # ------------------------------------------------------------------ every step
    def can_run(self, num_reqs: int, num_tokens: int) -> bool:
        """Decode-only (one new token per request, so num_tokens == num_reqs) and small enough."""
        return num_tokens == num_reqs and 0 < num_reqs <= self.max_size

    def padded_size(self, num_reqs: int) -> int:
        """The smallest captured size >= num_reqs."""
        return self.capture_sizes[bisect.bisect_left(self.capture_sizes, num_reqs)]

    @torch.inference_mode()
    def prepare(self, inputs: PreparedInputs, size: int) -> None:
        """Copy a decode step's tensors into rows 0..n-1 of the static buffers and pad rows n..size-1."""
        n = inputs.input_ids.shape[0]
        self.input_ids[:n].copy_(inputs.input_ids)
        self.input_ids[n:size].zero_()
        self.positions[:n].copy_(inputs.positions)
        self.positions[n:size].zero_()
        self.slot_mapping[:n].copy_(inputs.slot_mapping)
        self.slot_mapping[n:size].fill_(PAD_SLOT_ID)
        self.seq_lens[:n].copy_(inputs.seq_lens)
        self.seq_lens[n:size].zero_()
        self.query_start_loc[: n + 1].copy_(inputs.query_start_loc)
        self.query_start_loc[n + 1: size + 1].fill_(n)
        # Columns past cdiv(max_model_len, block_size) are never read (seq_len <= max_model_len).
        width = min(inputs.block_table.shape[1], self.block_table.shape[1])
        self.block_table[:n, :width].copy_(inputs.block_table[:, :width])
        self.block_table[:n, width:].zero_()
        self.block_table[n:size].zero_()

    @torch.inference_mode()
    def run(self, inputs: PreparedInputs) -> torch.Tensor:
        """Replay the graph of the padded size -> hidden [n, H] (a view, valid until the next replay)."""
        num_tokens = inputs.input_ids.shape[0]
        size = self.padded_size(num_tokens)
        self.prepare(inputs, size)
        self.graphs[size].replay()
        self.num_replays += 1
        self.num_padded_replays += size != num_tokens
        return self.outputs[size][:num_tokens]
