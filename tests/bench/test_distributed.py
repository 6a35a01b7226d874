"""`python -m mini bench distributed` runs end to end on a tiny workload and reports its last line.

The figures themselves are benchmarks (the README quotes them); here: the sections run, every system of a
pair produced the same greedy tokens (the benchmark raises otherwise), and bad input is refused."""

import math
import re

import pytest
import torch

from mini.bench import distributed


def test_split_and_tp_sections_run_and_print_the_summary_line(capsys, monkeypatch):
    monkeypatch.setenv("MINI_ENGINE_CORE_THREADS", "1")   # main() sets it: restored after the test
    threads = torch.get_num_threads()
    try:
        results = distributed.main(["--only", "split,tp", "--num-prompts", "2", "--output-len", "3", "--rounds", "1",
                                    "--smollm2-prompts", "0"])
    finally:
        torch.set_num_threads(threads)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"mp_overhead_ms_per_step=-?\d+\.\d{3} async_speedup=nan tp2_over_tp1=\d+\.\d{3}", last), last
    assert math.isfinite(results["mp_overhead_ms_per_step"])
    assert results["tp2_over_tp1"] > 0


def test_an_unknown_section_is_refused_with_the_allowed_ones():
    with pytest.raises(SystemExit, match="unknown section.*split, async, tp, dp"):
        distributed.main(["--only", "split,pipeline"])


def test_threads_must_be_positive():
    with pytest.raises(SystemExit, match="--threads must be >= 1"):
        distributed.main(["--threads", "0", "--only", "split"])


def test_pairs_that_disagree_are_reported(monkeypatch):
    calls = iter([(0.1, [[1, 2]]), (0.1, [[1, 3]])])
    monkeypatch.setattr(distributed, "time_generate", lambda llm, prompts, n: next(calls))
    with pytest.raises(AssertionError, match="b produced other tokens than a"):
        distributed.compare({"a": object(), "b": object()}, [[5]], 2, rounds=1)
