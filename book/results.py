"""Benchmark result files: docs/benchmarks/results/*.json, one file per recorded run (or per table of runs
carried over from the README, where the figures were typed before these files existed).

A file:

    {"table": "engine",                       # the table of docs/ it belongs to
     "title": "...", "command": "python -m mini bench",
     "source": "recorded by python -m book.record ..." | "transcribed from README.md at commit ...",
     "columns": [["commit", "run.commit"], ["mini", "mini", 0], ...],   # header, key (run.*: the run's
                                                                          # field), decimals (optional)
     "runs": [{"commit": "303d8ad" | null, "date": "2026-11-25" | null, "machine": "...", "threads": 2 | null,
               "note": "...", "rows": [{"mini": {"median": 3782, "min": 3700, "max": 3800}, ...}]}]}

A figure is a number, a string, {"median", "min", "max"} (median and spread), or {"runs": [...]} (each
run's value, where only a few were taken). A field the run's record
did not give (an old README row without its commit) is null, never guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "results"
RUN_FIELDS = ("commit", "date", "machine", "threads")


@dataclass(frozen=True, slots=True)
class ResultFile:
    path: Path
    data: dict

    @property
    def table(self) -> str:
        return self.data["table"]


def validate(data: dict, where: str = "result") -> list[str]:
    """What is wrong with one result file's content ([] when nothing)."""
    problems = [f"{where}: missing {key!r}" for key in ("table", "title", "command", "source", "columns", "runs")
                if key not in data]
    for number, run in enumerate(data.get("runs", [])):
        problems += [f"{where}: run {number} has no {field!r} (null when unknown)" for field in RUN_FIELDS
                     if field not in run]
        if not run.get("rows"):
            problems.append(f"{where}: run {number} has no rows")
        for row in run.get("rows", []):
            for key, value in row.items():
                if isinstance(value, dict) and not ({"median"} <= set(value) <= {"median", "min", "max"}
                                                    or set(value) == {"runs"}):
                    problems.append(f"{where}: figure {key!r} is neither a number, median/min/max nor runs: {value}")
    return problems


def load_all(results_dir: Path = RESULTS_DIR) -> list[ResultFile]:
    return [ResultFile(path, json.loads(path.read_text(encoding="utf-8")))
            for path in sorted(results_dir.glob("*.json"))]


def by_table(results_dir: Path = RESULTS_DIR) -> dict[str, list[ResultFile]]:
    """{table: its files}, the figures carried over from the README first, then the recorded runs by name
    (`<table>-<date>-<commit>.json`: by date)."""
    tables: dict[str, list[ResultFile]] = {}
    ordered = sorted(load_all(results_dir), key=lambda r: (not r.data["source"].startswith("transcribed"), r.path.name))
    for result in ordered:
        tables.setdefault(result.table, []).append(result)
    return tables


def save(data: dict, path: Path) -> Path:
    problems = validate(data, str(path))
    if problems:
        raise ValueError("; ".join(problems))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
