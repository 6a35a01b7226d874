"""Benchmark tables in docs/ come from the result files (docs/benchmarks/results/*.json), never typed by hand:
every file is well formed, every table block is what `python -m book.tables` renders, no Markdown table of
figures stands outside such a block, and what a bench prints is read into a result file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from book import results, tables
from book.record import parse_output, result_from_output

DOCS = Path(__file__).resolve().parents[2] / "docs"
FIGURE_PAGES = [DOCS / "benchmarks.md", DOCS / "gpu.md"]

ENGINE_OUTPUT = """machine: x86_64 x86_64, 2 cores; torch 2.13.0+cpu, 2 threads; commit abc1234
round 0: mini 9.20s (cpu 18.1s, 300 steps), transformers 20.01s
mini:          2293.00 (2103.00-2364.00) output tok/s, median (min-max)
transformers:  946.00 (933.00-1031.00) output tok/s  (batch 32, padded)
model alone:   2423.00 (2252.00-2864.00) output tok/s  (ceiling: the same batches, no engine)
speedup per round: 2.42 (2.22-2.53)
speedup_vs_transformers=2.42 ceiling_fraction=0.95
"""


def test_every_result_file_is_well_formed():
    found = results.load_all()
    assert len(found) >= 10
    problems = [p for r in found for p in results.validate(r.data, r.path.name)]
    assert not problems, problems


def test_the_guides_show_what_the_result_files_give():
    assert tables.main(["--check"]) == 0, "run python -m book.tables"


def test_every_table_block_has_results_and_every_result_a_block():
    used = {m["table"] for page in tables.guides() for m in tables.BLOCK.finditer(page.read_text(encoding="utf-8"))}
    assert used == set(results.by_table())


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=lambda p: p.name)
def test_no_table_is_typed_by_hand(page):
    outside = tables.BLOCK.sub("", page.read_text(encoding="utf-8"))
    typed = [line for line in outside.splitlines() if re.match(r"\s*\|", line)]
    assert not typed, typed


def test_a_stale_table_is_found(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("<!-- benchmark-table: engine -->\n| typed | 1 |\n<!-- end benchmark-table -->\n")
    monkeypatch.setattr(tables, "guides", lambda docs_dir=None: [page])
    assert tables.main(["--check"]) == 1
    assert tables.main([]) == 0 and "3,782" in page.read_text()


def test_a_bench_output_becomes_a_result_that_joins_its_table():
    parsed = parse_output(ENGINE_OUTPUT)
    assert (parsed["commit"], parsed["threads"]) == ("abc1234", 2)
    assert parsed["figures"]["mini"] == {"median": 2293.0, "min": 2103.0, "max": 2364.0}
    result = result_from_output("engine", [], ENGINE_OUTPUT, "engine", "", "2026-11-28")
    assert not results.validate(result)
    run = result["runs"][0]
    assert run["date"] == "2026-11-28" and run["machine"].endswith("torch 2.13.0+cpu")
    assert run["rows"][0]["speedup_vs_transformers"] == {"median": 2.42, "min": 2.22, "max": 2.53}
    known = results.by_table()["engine"]
    line = tables.render_table([*known, results.ResultFile(Path("new.json"), result)]).splitlines()[-3]
    assert line.startswith("| abc1234 | 2026-11-28 |") and "2,293 (2,103-2,364)" in line
    json.dumps(result)


def test_a_bench_without_a_machine_line_gets_this_machine():
    result = result_from_output("sampler", [], "speedup_vs_loop=11.23 cost_vs_sort=0.22\n", "sampler", "", "2026-11-28",
                                machine={"machine": "x86_64, 2 cores, torch 2.13.0+cpu", "threads": None,
                                         "commit": "abc"})
    assert result["runs"][0]["commit"] == "abc" and result["runs"][0]["rows"][0]["speedup_vs_loop"] == 11.23
