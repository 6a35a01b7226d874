"""`compilation_config` (mini/compilation.py, as vLLM's): bad values are refused naming the modes; mode 3 traces the
model's forward ONCE for a symbolic token count, with no graph break (attention is the opaque op
`mini::unified_attention`, reading the forward context), and greedy output stays token-identical to eager across
steps of every batch size, one-token steps included, without compiling again.

The engines here run in process (tests/conftest.py INPROC_TEST_FILES): Dynamo's counters are this process's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from mini import LLM, SamplingParams
from mini.compilation import CompilationMode, parse_compilation_config, parse_compilation_mode
from mini.config import EngineConfig
from mini.forward_context import get_forward_context

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine


@pytest.mark.parametrize("bad", [1, 2, 4, "3", True, {"mode": 1}, {"level": 3}])
def test_bad_compilation_config_names_the_modes(bad):
    with pytest.raises(ValueError, match="compilation_config"):
        EngineConfig(compilation_config=bad)


@pytest.mark.parametrize(("value", "mode"), [(None, 0), (0, 0), (3, 3), ({"mode": 3}, 3), ({}, 0)])
def test_modes_as_vllm_numbers_them(value, mode):
    assert parse_compilation_mode(value) == CompilationMode(mode)
    assert EngineConfig(compilation_config=value).compilation_mode == mode


def test_compilation_with_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(compilation_config=3, tensor_parallel_size=2)


def test_the_attention_op_outside_a_forward_names_the_context():
    with pytest.raises(RuntimeError, match="set_forward_context"):
        get_forward_context()
    query = torch.zeros(2, 6, 32)
    with pytest.raises(RuntimeError, match="set_forward_context"):
        torch.ops.mini.unified_attention(query, query[:, :2], query[:, :2], 0, 1.0)


@pytest.mark.parametrize("attention_backend", [None, "torch"])
def test_compiled_greedy_output_is_token_identical_and_traced_once(attention_backend):
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40)]
    later = [{"prompt_token_ids": list(range(50, 50 + n))} for n in (9, 2, 33, 21, 60)]
    alone = [{"prompt_token_ids": list(range(7, 12))}]   # a lone request: its decode steps hold ONE token
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine_args = {"max_num_batched_tokens": 32, "attention_backend": attention_backend}  # chunked: many sizes
    torch._dynamo.reset()   # what an earlier test compiled (the same function, the same shapes) would be reused
    eager = LLM(**engine_args)
    compiled = LLM(compilation_config=3, **engine_args)
    graphs_before, breaks_before = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    for batch in (prompts, later, alone):
        expected = [o.outputs[0].token_ids for o in eager.generate(batch, params, use_tqdm=False)]
        assert [o.outputs[0].token_ids for o in compiled.generate(batch, params, use_tqdm=False)] == expected
    assert counters["stats"]["unique_graphs"] - graphs_before == 1, \
        "the forward must be traced once: a new batch size (or the one-token step) compiled again"
    assert sum(counters["graph_break"].values()) == breaks_before, f"graph breaks: {dict(counters['graph_break'])}"


def test_engines_of_one_architecture_compile_to_one_graph_but_keep_their_own_weights():
    """Dynamo reuses a graph for a second engine of the same shapes (the weights are graph inputs, not constants):
    each engine must still run its own weights."""
    from mini.bench.gpu import random_weights_copy
    from mini.model.registry import SHIPPED_MODEL_DIR

    other = random_weights_copy(str(SHIPPED_MODEL_DIR), seed=1)
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    compiled = {model: LLM(model=model, compilation_config=3) for model in (None, other)}
    outputs = {}
    for model, llm in compiled.items():
        expected = [o.outputs[0].token_ids for o in LLM(model=model).generate(prompts, params, use_tqdm=False)]
        outputs[model] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert outputs[model] == expected, f"compiled engine of model {model} differs from eager"
    assert outputs[None] != outputs[other], "the two models' weights should give different tokens"


def test_bench_compile_times_both_engines_and_compares_their_tokens(capsys, monkeypatch):
    """`python -m mini bench compile` on a tiny workload: each engine's build is timed apart (on a GPU the
    CUDA-graph capture compiles there, so a run cut short still says which build it was in), and the last line
    carries the speedup, the compile seconds and whether the greedy tokens agree."""
    import re

    from mini.bench import compile as bench_compile

    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")   # main() sets it; restored after the test
    argv = ["--num-prompts", "2", "--prompt-len", "4", "8", "--output-len", "2", "3", "--rounds", "1"]
    assert bench_compile.main(argv) == 0
    out = capsys.readouterr().out
    assert out.index("eager engine built in") < out.index("compiled engine built in") < out.index("round 0:")
    assert re.fullmatch(r"compile_speedup=\d+\.\d\d compile_seconds=-?\d+\.\d identical=True split=attention",
                        out.strip().splitlines()[-1])


@pytest.mark.parametrize("bad", [{"mode": 3, "splitting_ops": ["vllm::unified_attention"]},
                                 {"mode": 3, "splitting_ops": "mini::unified_attention"}])
def test_bad_splitting_ops_name_the_allowed_values(bad):
    with pytest.raises(ValueError, match="splitting_ops.*mini::unified_attention"):
        EngineConfig(compilation_config=bad)


@pytest.mark.parametrize(("value", "ops"), [(3, ("mini::unified_attention",)), ({"mode": 3, "splitting_ops": []}, ()),
                                            ({"mode": 3, "splitting_ops": None}, ("mini::unified_attention",))])
def test_splitting_ops_default_to_attention_as_vllms_mode_3(value, ops):
    assert parse_compilation_config(value).splitting_ops == ops


def test_one_graph_compile_is_token_identical_and_traced_once():
    """`splitting_ops=[]`: the whole forward as one inductor graph (what vLLM runs on a CPU)."""
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    torch._dynamo.reset()
    expected = [o.outputs[0].token_ids for o in LLM(max_num_batched_tokens=32).generate(prompts, params,
                                                                                          use_tqdm=False)]
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = LLM(compilation_config={"mode": 3, "splitting_ops": []}, max_num_batched_tokens=32)
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)] == expected
    assert counters["stats"]["unique_graphs"] - graphs_before == 1


def test_piecewise_split_at_attention_with_layer_pieces_that_read_alike(monkeypatch):
    """The traced forward of an L-layer model splits into 2L + 1 pieces: L attention calls, left as they are, and
    L + 1 pieces compiled by inductor. The pieces between two attention calls are the same code in every layer
    once their inputs are renamed, which is what lets inductor's cache compile one and reuse it."""
    import mini.compilation
    from mini.piecewise_compile import _canonical_inputs, _CompiledPiece, make_piecewise_backend, split_graph

    captured = {}

    def capturing(splitting_ops):
        real = make_piecewise_backend(splitting_ops)

        def backend(graph, example_inputs):
            captured["graph"] = copy.deepcopy(graph)
            captured["split"] = real(graph, example_inputs)
            return captured["split"]
        return backend

    monkeypatch.setattr(mini.compilation, "make_piecewise_backend", capturing)
    torch._dynamo.reset()
    llm = LLM(compilation_config=3)
    llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    num_layers = llm.llm_engine.hf_config.num_hidden_layers
    split, compiled_names, attention_names = split_graph(captured["graph"], ["mini::unified_attention"])
    assert len(attention_names) == num_layers and len(compiled_names) == num_layers + 1
    for name in attention_names:
        calls = [n for n in getattr(split, name).graph.nodes if n.op == "call_function"]
        assert [str(n.target) for n in calls] == ["mini.unified_attention.default"], name
    middle = [getattr(split, name) for name in compiled_names[1:-1]]
    assert middle[0].code != middle[1].code, "split_module names a piece's inputs after its layer"
    for piece in middle:
        _canonical_inputs(piece)
    assert len({piece.code for piece in middle}) == 1, "a middle piece differs from layer to layer once renamed"
    run = captured["split"]
    assert all(isinstance(getattr(run, name), _CompiledPiece) for name in compiled_names)
    assert not any(isinstance(getattr(run, name), _CompiledPiece) for name in attention_names)


def test_engines_without_a_profiling_run_trace_once_and_a_second_engine_reuses_the_graph():
    """With `num_gpu_blocks_override` no eager profiling run precedes the first compiled step, so the trace is the
    first thing to meet the model (the rotary table must not be made during it, or a second trace follows); a
    second engine of the same shapes runs the first one's graph (one shared backend, mini/piecewise_compile.py)."""
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    for blocks in (64, 100):
        llm = LLM(compilation_config=3, num_gpu_blocks_override=blocks)
        for prompt in ("hi there", "a longer prompt than the first one"):
            llm.generate([prompt], params, use_tqdm=False)
    assert counters["stats"]["unique_graphs"] - graphs_before == 1, (
        "traced again: a guard failed (TORCH_LOGS=recompiles)")


def test_a_draft_model_is_compiled_with_its_target_and_drafts_the_same_tokens():
    """Speculative decoding with a draft model under `compilation_config=3`: the draft is compiled too (its own
    graph, as vLLM compiles the draft model under the target's config), and greedy output is eager's."""
    prompts = ["def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n", "for i in range(10):\n    print(i)\n"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    spec = {"method": "draft_model", "num_speculative_tokens": 3}
    torch._dynamo.reset()
    expected = [o.outputs[0].token_ids for o in LLM(speculative_config=spec).generate(prompts, params,
                                                                                        use_tqdm=False)]
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = LLM(speculative_config=spec, compilation_config=3)
    drafter = compiled.llm_engine.model_runner.drafter
    assert drafter.net.model.layers[0].self_attn.use_attention_op, "the draft model was not compiled"
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)] == expected
    assert counters["stats"]["unique_graphs"] - graphs_before == 2, "one graph for the target, one for the draft"
