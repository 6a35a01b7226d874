"""`python -m mini bench gpu`: without CUDA it stops at once with a clear message (exit 2); its GPU tests are the
very test files the CPU suite runs (under TRITON_INTERPRET=1 or the CUDA-graph stand-in), so nothing is tested
only on a GPU."""

from __future__ import annotations

import pytest
import torch

from mini.__main__ import main as cli
from mini.bench import gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: run `python -m mini bench gpu`")
def test_without_cuda_it_says_it_needs_cuda(capsys):
    assert cli(["bench", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "scripts/test.sh" in err


def test_its_gpu_tests_are_files_of_the_cpu_suite():
    for path in gpu.GPU_TESTS:
        assert (gpu.REPO_ROOT / path).is_file(), path
        assert path.startswith("tests/") and path.rsplit("/", 1)[-1].startswith("test_")  # collected by `pytest tests`


def test_its_mixes_cover_decode_and_prefill():
    query_lens = {q for _, mix in gpu.GPU_MIXES for q, _ in mix}
    assert 1 in query_lens and max(query_lens) >= 512
    assert all(q <= s for _, mix in gpu.GPU_MIXES for q, s in mix)


def test_random_weights_copy_keeps_the_architecture_and_tokenizer(tmp_path):
    """`--random-weights` (for a GPU machine the checkpoint cannot be copied to): same config and tokenizer, new
    seeded weights, loadable by the engine."""
    import json

    from mini import LLM, SamplingParams
    from mini.model.registry import SHIPPED_MODEL_DIR

    source = tmp_path / "no-weights"
    source.mkdir()
    for path in SHIPPED_MODEL_DIR.iterdir():
        if not path.name.endswith(".safetensors"):
            (source / path.name).write_bytes(path.read_bytes())
    folder = gpu.random_weights_copy(str(source), seed=123)
    config, original = (json.loads((dir_ / "config.json").read_text()) for dir_ in (gpu.Path(folder), source))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert config[key] == original[key], key
    assert (gpu.Path(folder) / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    llm = LLM(model=folder, dtype="float32")
    out = llm.generate(["def main("], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_a_report_cut_short_still_names_what_ran(tmp_path):
    """The report is written after every step, so a run stopped by a time limit keeps its finished figures."""
    import json

    partial = {"device": "GPU X", "machine": "machine: test",
               "tests": {"command": "pytest", "tests": 3, "failures": 1, "errors": 0, "skipped": 0,
                         "failed": ["tests.t::bad"]}}
    gpu.write_report(tmp_path, partial)
    text = (tmp_path / "report.md").read_text()
    assert "# mini on GPU X" in text and "3 tests, 1 failures" in text and "tests.t::bad" in text
    assert "(not run yet)" in text and "still running" in text
    assert json.loads((tmp_path / "report.json").read_text()) == partial
    partial.update(kernels=[], model="m", engine={"cuda graphs": {"command": "bench", "figures": {"x": "1"},
                                                                 "stderr_tail": []}}, seconds=12.0)
    gpu.write_report(tmp_path, partial)
    text = (tmp_path / "report.md").read_text()
    assert "- cuda graphs: `bench` -> {'x': '1'}" in text and "Total: 12 s" in text


def test_its_parser_can_skip_each_timing():
    args = gpu.build_parser().parse_args(["--skip-kernels", "--skip-compile", "--skip-tests"])
    assert args.skip_kernels and args.skip_compile and args.skip_tests


def test_a_test_run_cut_short_says_how_far_it_got():
    log = ("tests/test_a.py::test_one PASSED                 [ 33%]\n"
           "tests/test_a.py::test_two[x-1] FAILED            [ 66%]\n"
           "tests/test_b.py::test_three SKIPPED (no CUDA)    [ 99%]\n"
           "tests/test_b.py::test_four ")
    assert gpu.progress_of_verbose_log(log) == {"passed_so_far": 1, "skipped_so_far": 1,
                                                "failed_so_far": ["tests/test_a.py::test_two[x-1]"],
                                                "last_finished": "tests/test_b.py::test_three"}
    assert gpu.progress_of_verbose_log("")["last_finished"] is None


def test_each_engine_step_is_a_command_its_benchmark_accepts():
    """The GPU machine is lent rarely: a step whose options its benchmark refuses would cost a run there."""
    import importlib

    from mini.__main__ import BENCHMARKS

    runs = gpu.engine_runs(gpu.build_parser().parse_args([]))
    assert [mode for _, _, mode in runs] == ["", "compile", "async_scheduling", ""]
    for _, extra, mode in runs:
        command = gpu.bench_command("/models/m", extra, 64, mode)
        options = command[5:] if mode else command[4:]
        args = importlib.import_module(BENCHMARKS[mode or "engine"]).build_parser().parse_args(options)
        assert (args.model, args.device, args.dtype, args.rounds) == ("/models/m", "cuda", "bfloat16", 3)
    skipped = gpu.engine_runs(gpu.build_parser().parse_args(["--skip-compile", "--skip-async"]))
    assert [label for label, _, _ in skipped] == ["cuda graphs", "enforce_eager"]


def test_bench_async_scheduling_runs_from_the_command_line(capsys):
    assert cli(["bench", "async_scheduling", "--requests", "2", "--output-len", "3", "--prompt-len", "4",
                "--rounds", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("sync_ms_per_step=") and "async_speedup=" in last


def test_two_engines_on_one_card_each_get_a_fixed_kv_budget():
    from mini.bench.workload import side_by_side_kv_args

    assert side_by_side_kv_args("cuda") == side_by_side_kv_args("cuda:0") == {"kv_cache_memory_bytes": 2 << 30}
    assert side_by_side_kv_args("cpu") == {}
