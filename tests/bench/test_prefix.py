"""`python -m mini bench prefix`: warm-up, then alternating off/on rounds reported as medians with their
spread (issue 26: one run with no warm-up once showed caching "slower"). A smoke test on a tiny workload;
timings are never asserted."""

import pytest

from mini.bench import prefix

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes


def test_prefix_bench_reports_medians_of_alternating_rounds_with_their_spread(capsys):
    summary = prefix.main(["--num-requests", "2", "--shared-len", "16", "--private-len", "3", "--max-tokens", "2",
                           "--rounds", "2"])
    out = capsys.readouterr().out
    assert set(summary) == {"ttft_speedup", "throughput_speedup", "hit_rate"}
    assert "warm-up + 2 alternating rounds" in out
    assert out.count("(rounds ") == 4                    # TTFT and throughput, caching off and on
    assert "per-round speedups" in out
    assert out.strip().splitlines()[-1].startswith("ttft_speedup=")
    assert summary["hit_rate"] > 0                      # the second request hits the shared prompt


def test_prefix_bench_rejects_zero_rounds():
    with pytest.raises(SystemExit):
        prefix.main(["--rounds", "0"])
