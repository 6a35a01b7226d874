"""The benchmark tables of docs/: rendered from the result files, never typed by hand.

In a guide (docs/*.md, and README.md), a table is a block

    <!-- benchmark-table: engine -->
    ...generated...
    <!-- end benchmark-table -->

`python -m book.tables` rewrites every such block from docs/benchmarks/results/; `--check` exits 1 when a
guide differs from what the result files give (a test runs the same check).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from book.results import RESULTS_DIR, ResultFile, by_table

DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"(<!-- benchmark-table: (?P<table>[\w-]+) -->\n)(?P<body>.*?)(<!-- end benchmark-table -->)",
                   re.DOTALL)


def format_number(value: float, decimals: int | None = None) -> str:
    """Thousands separated; `decimals` (the column's, from its result file) keeps the recorded precision."""
    if decimals is not None:
        return f"{value:,.{decimals}f}"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 100:
        value = int(value)
    return f"{value:,}" if abs(value) >= 1000 else str(value)


def format_figure(value, decimals: int | None = None) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) and "runs" in value:
        return ", ".join(format_number(v, decimals) for v in value["runs"])
    if isinstance(value, dict):
        median = format_number(value["median"], decimals)
        if "min" in value and "max" in value:
            return f"{median} ({format_number(value['min'], decimals)}-{format_number(value['max'], decimals)})"
        return median
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return format_number(value, decimals)
    return str(value).replace("|", "\\|")


def render_table(results: list[ResultFile]) -> str:
    """One Markdown table: the first file's columns, one line per row of every run of every file."""
    columns = results[0].data["columns"]
    lines = ["| " + " | ".join(column[0] for column in columns) + " |",
             "|" + "---|" * len(columns)]
    for result in results:
        for run in result.data["runs"]:
            for row in run["rows"]:
                cells = [format_figure(run.get(key[4:]) if key.startswith("run.") else row.get(key), *decimals)
                         for _, key, *decimals in columns]
                lines.append("| " + " | ".join(cells) + " |")
    sources = ", ".join(f"`results/{r.path.name}`" for r in results)
    machines = "; ".join(dict.fromkeys(run["machine"] for r in results for run in r.data["runs"] if run["machine"]))
    lines.append("")
    lines.append(f"*`{results[0].data['command']}` on {machines}; generated from {sources}.*")
    return "\n".join(lines) + "\n"


def render_text(text: str, tables: dict[str, list[ResultFile]]) -> str:
    def replace(match: re.Match) -> str:
        table = match.group("table")
        if table not in tables:
            raise KeyError(f"no result file for table {table!r} in {RESULTS_DIR}")
        return match.group(1) + render_table(tables[table]) + match.group(4)
    return BLOCK.sub(replace, text)


def guides(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """Every guide of docs/, and the README (which shows the quantization tables too)."""
    readme = docs_dir.parent / "README.md"
    return sorted(docs_dir.glob("*.md")) + ([readme] if readme.is_file() else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m book.tables", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a guide differs from the result files")
    args = parser.parse_args(argv)
    tables = by_table()
    stale = []
    for path in guides():
        text = path.read_text(encoding="utf-8")
        rendered = render_text(text, tables)
        if rendered != text:
            stale.append(path)
            if not args.check:
                path.write_text(rendered, encoding="utf-8")
    verb = "out of date (run python -m book.tables)" if args.check else "rewritten"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
