"""mini/worker/cuda_graph.py: capture sizes, config checks, static buffers and padding, and the graph path end to end.

On a CPU the graph path runs with the stand-in `EagerReplayGraph` (patched in through `graph_class`): the same
static buffers, padding and replay bookkeeping as a CUDA graph, without the GPU. Which test catches what:

* `test_prepare_pads_*` checks every padded value (slot -1, zero-length queries, seq_len 0, zeroed block
  rows), including padding that would be harmless to outputs (e.g. a pad slot of 0: the null block);
* the end-to-end tests compare greedy tokens with the eager engine: they catch padding or copying that
  changes results (a pad slot that hits a live cache slot, a stale row, a wrong row of the output), and
  `test_broken_padding_changes_the_output` shows they do;
* `test_only_the_triton_decode_forward_is_capturable` checks, on a CPU too, that the forward real graphs
  capture reads no device value into Python (what would make a CUDA graph wrong or fail to capture);
* the CUDA tests (skipped without a GPU) run real torch.cuda graphs with the Triton backend.
"""

from __future__ import annotations

import logging

import pytest
import torch

from labs import plug
from mini import LLM, SamplingParams, roles
from mini.config import EngineConfig
from mini.worker import cuda_graph
from mini.worker import model_runner as model_runner_module
from mini.worker.prepare_inputs import prepare_inputs

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPT_LENGTHS = [1, 4, 7, 13, 22, 3, 9]  # one token, an exact block, ragged, longer than the token budget
MAX_TOKENS = [2, 4, 6, 8, 10, 12, 14]    # requests finish one after another: decode batches 7, 6, ..., 1


def make_prompts(lengths: list[int], vocab_size: int = 211, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(0, vocab_size, (n,), generator=generator).tolist()} for n in lengths]


def build_llm(model_dir, backend: str, stand_in: bool, monkeypatch, **kwargs) -> LLM:
    """A small engine: block_size 4 and a 16-token budget, so prompts are chunked and mixed with decodes."""
    engine_args = {"model": str(model_dir), "skip_tokenizer_init": True, "attention_backend": backend,
                   "block_size": 4, "max_num_batched_tokens": 16, "max_num_seqs": 8, "max_model_len": 128,
                   "num_gpu_blocks_override": 96}
    engine_args.update(kwargs)
    with monkeypatch.context() as patch:
        if stand_in:
            patch.setattr(cuda_graph, "graph_class", lambda device: cuda_graph.EagerReplayGraph)
        return LLM(**engine_args)


def greedy(llm: LLM, lengths=PROMPT_LENGTHS, max_tokens=MAX_TOKENS) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=count) for count in max_tokens]
    outputs = llm.generate(make_prompts(lengths), params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize(("max_num_seqs", "cap", "expected"), [
    (64, None, [1, 2, 4, 8, 16, 32, 64]),                          # default: min(max_num_seqs, 512)
    (1000, None, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
    (12, None, [1, 2, 4, 8, 12]),                                  # the cap itself, not a power of two
    (64, 12, [1, 2, 4, 8, 12]),
    (64, 16, [1, 2, 4, 8, 16]),
    (64, 1, [1]),
    (64, 3, [1, 2, 3]),
])
def test_capture_sizes_are_powers_of_two_below_the_cap_plus_the_cap(max_num_seqs, cap, expected):
    config = EngineConfig(max_num_seqs=max_num_seqs, max_cudagraph_capture_size=cap)
    assert config.cudagraph_capture_sizes == expected


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_enforce_eager_must_be_a_bool(value):
    with pytest.raises(ValueError, match="enforce_eager must be a bool"):
        EngineConfig(enforce_eager=value)


@pytest.mark.parametrize("value", [0, -4, True, 2.0, "8", 65])
def test_max_cudagraph_capture_size_is_checked(value):
    # Above max_num_seqs (64) is rejected, not clamped: no decode batch is ever that large.
    with pytest.raises(ValueError,
                       match=r"max_cudagraph_capture_size must be None or an int in \[1, max_num_seqs=64\]"):
        EngineConfig(max_num_seqs=64, max_cudagraph_capture_size=value)


def test_llm_accepts_enforce_eager_and_the_cap(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, enforce_eager=True, max_cudagraph_capture_size=4,
              max_num_seqs=8, num_gpu_blocks_override=16, max_model_len=64)
    assert llm.llm_engine.config.enforce_eager is True
    assert llm.llm_engine.config.cudagraph_capture_sizes == [1, 2, 4]


def test_cli_parsers_accept_enforce_eager():
    import argparse

    pytest.importorskip("fastapi", reason="the server's parser needs the `serve` extra (a GPU image may lack it)")
    from mini.__main__ import build_parser
    from mini.entrypoints.chat_cli import build_parser as chat_parser
    from mini.entrypoints.openai.api_server import add_serve_arguments, engine_args_from

    assert build_parser().parse_args(["generate", "hi", "--enforce-eager"]).enforce_eager is True
    assert build_parser().parse_args(["generate", "hi"]).enforce_eager is False
    assert chat_parser().parse_args(["--enforce-eager"]).enforce_eager is True
    serve_args = add_serve_arguments(argparse.ArgumentParser()).parse_args(["--enforce-eager"])
    assert engine_args_from(serve_args)["enforce_eager"] is True
    EngineConfig(**{**engine_args_from(serve_args), "device": "cpu"})  # every serve argument is an engine arg


def test_when_graphs_are_off():
    cpu = EngineConfig()
    assert "CPU always runs eager" in cuda_graph.disabled_reason(cpu, "torch_fast", cuda_graph.graph_class(
        torch.device("cpu")))
    assert cuda_graph.disabled_reason(EngineConfig(enforce_eager=True, max_model_len=64), "triton",
                                      cuda_graph.CudaGraph) == "enforce_eager=True"
    assert "cannot be captured" in cuda_graph.disabled_reason(EngineConfig(max_model_len=64), "torch_fast",
                                                              cuda_graph.CudaGraph)
    assert cuda_graph.disabled_reason(EngineConfig(max_model_len=64), "triton", cuda_graph.CudaGraph) is None
    # The stand-in reruns host code on replay, so any backend may use it.
    assert cuda_graph.disabled_reason(EngineConfig(max_model_len=64), "torch", cuda_graph.EagerReplayGraph) is None
    assert "would not see the replacement" in cuda_graph.disabled_reason(
        EngineConfig(max_model_len=64, parts={"rms_norm": lambda x, w, eps: x}), "triton", cuda_graph.CudaGraph)


def test_cpu_engine_runs_eager_and_says_why(tiny_llama_dir, caplog):
    with caplog.at_level(logging.INFO, logger="mini.worker"):
        llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, num_gpu_blocks_override=16, max_model_len=64)
    assert llm.llm_engine.model_runner.cuda_graph_runner is None
    assert "CUDA graphs off, decode runs eager: device 'cpu'" in caplog.text


# ---------------------------------------------------------------------- static buffers and padding
def make_runner(capture_sizes=(1, 2, 4, 8), max_model_len=32, block_size=4) -> cuda_graph.CudaGraphRunner:
    """A runner whose buffers are filled with garbage, as if earlier, larger steps had left values behind."""
    runner = cuda_graph.CudaGraphRunner(None, [], capture_sizes, max_model_len, block_size, "cpu",
                                        cuda_graph.EagerReplayGraph)
    for buffer in (runner.input_ids, runner.positions, runner.slot_mapping, runner.seq_lens,
                   runner.query_start_loc, runner.block_table):
        buffer.fill_(7)
    return runner


def decode_inputs():
    """Three requests, one new token each: contexts of 5, 7 and 3 tokens (phase 02's worked example)."""
    tokens = [[1, 2, 3, 4, 5, 99], [1, 6, 5, 7, 8, 9, 10, 98], [1, 12, 13, 97]]
    return prepare_inputs(tokens, [5, 7, 3], [1, 1, 1], [[1, 2], [3, 4], [5]], block_size=4)


def test_padded_size_and_can_run():
    runner = make_runner()
    assert [runner.padded_size(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert runner.can_run(num_reqs=3, num_tokens=3)
    assert not runner.can_run(num_reqs=3, num_tokens=5)        # a prefill (chunk) or drafts in the batch
    assert not runner.can_run(num_reqs=9, num_tokens=9)        # above the largest captured size
    assert not runner.can_run(num_reqs=0, num_tokens=0)


def test_prepare_pads_a_decode_batch_to_the_captured_size():
    runner, inputs = make_runner(), decode_inputs()
    runner.prepare(inputs, runner.padded_size(3))               # 3 requests -> the graph of 4
    assert runner.input_ids[:4].tolist() == [99, 98, 97, 0]
    assert runner.positions[:4].tolist() == [5, 7, 3, 0]
    assert runner.slot_mapping[:4].tolist() == [9, 19, 23, -1]   # padding token: not stored
    assert runner.seq_lens[:4].tolist() == [6, 8, 4, 0]          # padding request: no context
    assert runner.query_start_loc[:5].tolist() == [0, 1, 2, 3, 3]  # ... and a zero-length query
    assert runner.block_table[:4].tolist() == [[1, 2, 0, 0, 0, 0, 0, 0], [3, 4, 0, 0, 0, 0, 0, 0],
                                               [5, 0, 0, 0, 0, 0, 0, 0], [0] * 8]
    assert runner.slot_mapping[4:].tolist() == [7] * 4           # rows past the graph's size are not touched


def test_prepare_pads_several_rows_and_fills_every_padded_query_start():
    runner, inputs = make_runner(), decode_inputs()
    runner.prepare(inputs, 8)
    assert runner.slot_mapping.tolist() == [9, 19, 23] + [-1] * 5
    assert runner.seq_lens.tolist() == [6, 8, 4] + [0] * 5
    assert runner.query_start_loc.tolist() == [0, 1, 2, 3] + [3] * 5
    assert runner.block_table[3:].count_nonzero() == 0


def test_prepare_cuts_block_columns_past_max_model_len():
    runner = make_runner(max_model_len=8, block_size=4)           # static table: 2 block columns
    wide = decode_inputs()
    wide.block_table = torch.cat((wide.block_table, torch.full((3, 2), 9, dtype=torch.int32)), dim=1)
    runner.prepare(wide, 4)
    assert runner.block_table.tolist()[:4] == [[1, 2], [3, 4], [5, 0], [0, 0]]


# ---------------------------------------------------------------------- end to end on the CPU (stand-in graph)
class StepSpy:
    """Counts eager forwards and records (batch, padded size) of each replay."""

    def __init__(self, monkeypatch) -> None:
        self.eager_steps = 0
        self.replays: list[tuple[int, int]] = []
        original_run_model, original_prepare = model_runner_module.run_model, cuda_graph.CudaGraphRunner.prepare
        spy = self

        def run_model(*args, **kwargs):
            spy.eager_steps += 1
            return original_run_model(*args, **kwargs)

        def prepare(runner, inputs, size):
            spy.replays.append((int(inputs.input_ids.shape[0]), size))
            return original_prepare(runner, inputs, size)

        monkeypatch.setattr(model_runner_module.ModelRunner, "run_model", staticmethod(run_model))
        monkeypatch.setattr(cuda_graph.CudaGraphRunner, "prepare", prepare)


# "torch" (the reference) and "torch_fast" both take padded rows: torch_fast skips zero-length queries; the
# reference's batched decode gives padding rows NaN (no key to attend to), which stays in those rows.
@pytest.mark.parametrize("backend", ["torch_fast", "torch"])
def test_stand_in_graph_gives_the_eager_tokens(tiny_llama_dir, backend, monkeypatch):
    expected = greedy(build_llm(tiny_llama_dir, backend, stand_in=False, monkeypatch=monkeypatch))
    assert [len(tokens) for tokens in expected] == MAX_TOKENS
    llm = build_llm(tiny_llama_dir, backend, stand_in=True, monkeypatch=monkeypatch)
    runner = llm.llm_engine.model_runner.cuda_graph_runner
    assert runner is not None and runner.capture_sizes == [1, 2, 4, 8] and set(runner.outputs) == {1, 2, 4, 8}
    spy = StepSpy(monkeypatch)
    assert greedy(llm) == expected
    assert runner.num_replays == len(spy.replays) > 0 and spy.eager_steps > 0   # decode replayed, prefill eager
    assert runner.num_padded_replays > 0
    assert {(n, size) for n, size in spy.replays if n != size} >= {(3, 4)}, spy.replays
    assert all(size == runner.padded_size(n) for n, size in spy.replays)


def test_stand_in_graph_with_triton_kernels(tiny_llama_dir, monkeypatch):
    """The backend real graphs use: the decode kernel must return early for padded requests."""
    triton_utils = pytest.importorskip("mini.attention.triton_utils")
    if not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    lengths, max_tokens = [2, 5, 9], [2, 3, 4]                 # small: the kernels run under the interpreter
    device = "cuda" if torch.cuda.is_available() else "cpu"    # (without CUDA, under TRITON_INTERPRET=1)
    expected = greedy(build_llm(tiny_llama_dir, "triton", stand_in=False, monkeypatch=monkeypatch, device=device),
                      lengths, max_tokens)
    llm = build_llm(tiny_llama_dir, "triton", stand_in=True, monkeypatch=monkeypatch, device=device)
    spy = StepSpy(monkeypatch)
    assert greedy(llm, lengths, max_tokens) == expected
    assert (3, 4) in spy.replays, spy.replays


HOST_SYNCS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


def host_syncs_of_captured_forward(llm: LLM, monkeypatch) -> list[str]:
    """Tensor -> Python conversions (each a device-to-host sync on a GPU) made by the captured decode forward."""
    runner = llm.llm_engine.model_runner.cuda_graph_runner
    calls: list[str] = []

    def recording(name: str):
        original = getattr(torch.Tensor, name)

        def record(self, *args, **kwargs):
            calls.append(name)
            return original(self, *args, **kwargs)
        return record

    with monkeypatch.context() as patch:
        for name in HOST_SYNCS:
            patch.setattr(torch.Tensor, name, recording(name))
        with torch.inference_mode():
            runner._forward(runner.max_size)
    return calls


def test_only_the_triton_decode_forward_is_capturable(tiny_llama_dir, monkeypatch):
    """Why real graphs need attention_backend="triton": the others read device values into Python, which a
    CUDA graph cannot record (the value would be frozen at capture)."""
    triton_utils = pytest.importorskip("mini.attention.triton_utils")
    if not triton_utils.is_available():
        pytest.skip(triton_utils.unavailable_reason())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    syncs = {}
    for backend in ("triton", "torch_fast", "torch"):
        llm = build_llm(tiny_llama_dir, backend, stand_in=True, monkeypatch=monkeypatch, max_num_seqs=2,
                        device=device if backend == "triton" else "cpu")
        syncs[backend] = host_syncs_of_captured_forward(llm, monkeypatch)
    assert syncs["triton"] == []
    assert syncs["torch_fast"] and syncs["torch"], syncs   # the spy does see syncs where there are some


def test_broken_padding_changes_the_output(tiny_llama_dir, monkeypatch):
    """A pad slot pointing at a live cache slot (here request 0's first token) must change the tokens: the
    identical-output test above would catch such a bug."""
    expected = greedy(build_llm(tiny_llama_dir, "torch_fast", stand_in=False, monkeypatch=monkeypatch))
    llm = build_llm(tiny_llama_dir, "torch_fast", stand_in=True, monkeypatch=monkeypatch)
    original_prepare = cuda_graph.CudaGraphRunner.prepare

    def broken_prepare(runner, inputs, size):
        original_prepare(runner, inputs, size)
        live_slot = int(inputs.block_table[0, 0]) * 4          # block_size 4: request 0's position 0
        runner.slot_mapping[inputs.input_ids.shape[0]: size] = live_slot

    monkeypatch.setattr(cuda_graph.CudaGraphRunner, "prepare", broken_prepare)
    assert greedy(llm) != expected
    assert llm.llm_engine.model_runner.cuda_graph_runner.num_padded_replays > 0


def test_an_engine_replacing_a_forward_part_captures_nothing(tiny_llama_dir, monkeypatch, caplog):
    """Decided at start-up: a part of the forward replaced (rms_norm) -> no graphs, eager decode, same tokens;
    a part outside the forward (the sampler's) keeps the graphs."""
    expected = greedy(build_llm(tiny_llama_dir, "torch_fast", stand_in=True, monkeypatch=monkeypatch), [3, 5], [4, 4])
    with plug(rms_norm=roles.reference("rms_norm")), caplog.at_level(logging.INFO, logger="mini.worker"):
        llm = build_llm(tiny_llama_dir, "torch_fast", stand_in=True, monkeypatch=monkeypatch)
    assert llm.llm_engine.model_runner.cuda_graph_runner is None
    assert "['rms_norm']" in caplog.text
    assert greedy(llm, [3, 5], [4, 4]) == expected
    with plug(random_sample=roles.reference("random_sample")):
        llm = build_llm(tiny_llama_dir, "torch_fast", stand_in=True, monkeypatch=monkeypatch)
    runner = llm.llm_engine.model_runner.cuda_graph_runner
    assert greedy(llm, [3, 5], [4, 4]) == expected
    assert runner.num_replays > 0


def test_a_compiled_forward_is_captured_and_replayed_token_identically(tiny_llama_dir, monkeypatch):
    """compilation_config=3 under the graph stand-in: the compiled forward (attention an opaque op reading the
    forward context) runs inside capture and replay, on padded batches, and gives eager's tokens."""
    expected = greedy(build_llm(tiny_llama_dir, "torch", stand_in=False, monkeypatch=monkeypatch))
    llm = build_llm(tiny_llama_dir, "torch", stand_in=True, monkeypatch=monkeypatch, compilation_config=3)
    runner = llm.llm_engine.model_runner.cuda_graph_runner
    assert greedy(llm) == expected
    assert runner.num_replays > 0 and runner.num_padded_replays > 0


def test_enforce_eager_captures_nothing_even_with_a_graph_class(tiny_llama_dir, monkeypatch):
    llm = build_llm(tiny_llama_dir, "torch_fast", stand_in=True, monkeypatch=monkeypatch, enforce_eager=True)
    assert llm.llm_engine.model_runner.cuda_graph_runner is None


# ---------------------------------------------------------------------- real CUDA graphs
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


@cuda_only
def test_cuda_graphs_match_enforce_eager_with_triton(tiny_llama_dir, monkeypatch):
    args = {"device": "cuda"}
    eager = build_llm(tiny_llama_dir, "triton", stand_in=False, monkeypatch=monkeypatch, enforce_eager=True, **args)
    expected = greedy(eager)
    llm = build_llm(tiny_llama_dir, "triton", stand_in=False, monkeypatch=monkeypatch, **args)
    runner = llm.llm_engine.model_runner.cuda_graph_runner
    assert runner is not None and runner.graph_cls is cuda_graph.CudaGraph and runner.capture_sizes == [1, 2, 4, 8]
    assert greedy(llm) == expected
    assert runner.num_replays > 0 and runner.num_padded_replays > 0


@cuda_only
def test_cuda_graphs_of_the_compiled_forward_match_enforce_eager(tiny_llama_dir, monkeypatch):
    """torch.compile (inductor's Triton kernels around mini::unified_attention) captured in real CUDA graphs."""
    eager = build_llm(tiny_llama_dir, "triton", stand_in=False, monkeypatch=monkeypatch, enforce_eager=True,
                      device="cuda")
    expected = greedy(eager)
    llm = build_llm(tiny_llama_dir, "triton", stand_in=False, monkeypatch=monkeypatch, device="cuda",
                    compilation_config=3)
    runner = llm.llm_engine.model_runner.cuda_graph_runner
    assert runner is not None and runner.graph_cls is cuda_graph.CudaGraph
    assert greedy(llm) == expected
    assert runner.num_replays > 0


@cuda_only
def test_cuda_enforce_eager_captures_nothing(tiny_llama_dir, monkeypatch):
    llm = build_llm(tiny_llama_dir, "triton", stand_in=False, monkeypatch=monkeypatch, enforce_eager=True,
                    device="cuda")
    assert llm.llm_engine.model_runner.cuda_graph_runner is None


@cuda_only
def test_cuda_non_capturable_backend_runs_eager(tiny_llama_dir, monkeypatch):
    llm = build_llm(tiny_llama_dir, "torch_fast", stand_in=False, monkeypatch=monkeypatch, device="cuda")
    assert llm.llm_engine.model_runner.cuda_graph_runner is None
