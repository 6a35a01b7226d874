"""`python -m mini bench serve` smoke run: two small levels on loopback, a PNG, the last-line format."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("matplotlib")

from mini.bench.serve import main, percentile


def test_percentile_nearest_rank():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 99) == 5.0
    assert percentile(list(range(1, 101)), 99) == 99


def test_bench_serve_smoke(tmp_path, capsys):
    png = tmp_path / "serve.png"
    main(["--concurrency", "1,2", "--requests-per-level", "2", "--max-tokens", "3", "--max-prompt-len", "20",
          "--plot", str(png), "--max-num-seqs", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"peak_tokens_per_s=\d+\.\d p99_ttft_ms_at_16=nan", lines[-1]), lines[-1]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"])]
    assert [row[:2] for row in rows] == [["1", "2"], ["2", "2"]]
    assert all(float(row[2]) > 0 for row in rows)
