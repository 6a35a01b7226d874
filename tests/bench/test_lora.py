"""`python -m mini bench lora`: base, mixed and serial runs of one batch, reported as medians. A smoke test on a
tiny workload; timings are never asserted."""

import pytest

from mini.bench import lora


def test_lora_bench_reports_the_three_ways_and_the_ratios(capsys):
    summary = lora.main(["--num-adapters", "2", "--num-requests", "2", "--prompt-len", "4", "--max-tokens", "2",
                         "--rank", "2", "--rounds", "1"])
    out = capsys.readouterr().out
    assert set(summary) == {"mixed_vs_base", "serial_vs_mixed"}
    assert all(value > 0 for value in summary.values())
    for way in ("base", "mixed", "serial"):
        assert f"{way} ms: " in out and f"{way} tok/s: " in out, way
    assert out.startswith("machine: ")
    assert out.strip().splitlines()[-1].startswith("mixed_vs_base=")


def test_lora_bench_rejects_zero_adapters():
    with pytest.raises(SystemExit):
        lora.main(["--num-adapters", "0"])
