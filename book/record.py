"""Run a benchmark and keep its result: `python -m book.record <bench> [bench arguments]` runs
`python -m mini bench <bench> ...`, shows its output as it comes, and writes
docs/benchmarks/results/<table>-<date>-<commit>.json (book/results.py's format), which `python -m book.tables`
then renders into the guides.

The bench commands print their figures; this reads what they print, bench by bench alike:

- the machine line (`machine: ...; torch X, N threads; commit abc`, mini/bench/workload.py's `machine_line`);
- every `label: median (min-max) ...` line: a figure with its spread;
- every `name=value` pair: a summary figure.

A bench that prints no machine line gets this machine's (architecture, cores, torch) and the checkout's
commit, read here; its threads are those of `--threads` when given, else left null. The engine bench's
`speedup per round: M (a-b)` is kept as the spread of its `speedup_vs_transformers`. The run's date is today's
(UTC); `--table` names the table of docs/ the run joins (default: the bench's name,
`engine` for `python -m mini bench` alone), `--note` a word on the conditions (other jobs on the cores...).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import re
import subprocess
import sys

from book.results import RESULTS_DIR, by_table, save

MACHINE = re.compile(r"^machine: (?P<machine>[^;]*); torch (?P<torch>\S+), (?P<threads>\d+) threads; "
                     r"commit (?P<commit>\S+)")
SPREAD = re.compile(r"^(?P<label>[A-Za-z][\w ,.'()/-]*?):\s+(?P<median>-?[\d.]+) "
                    r"\((?P<min>-?[\d.]+)-(?P<max>-?[\d.]+)\)")
PAIR = re.compile(r"(?<![\w.])(?P<name>[a-z][a-z0-9_]*)=(?P<value>-?\d+(?:\.\d+)?)(?![\w.])")


def _number(text: str) -> float | int:
    return int(text) if re.fullmatch(r"-?\d+", text) else float(text)


def parse_output(text: str) -> dict:
    """{'machine', 'threads', 'commit', 'figures'} read from a bench's printed output."""
    run: dict = {"machine": None, "threads": None, "commit": None, "figures": {}}
    for line in text.splitlines():
        line = line.strip()
        if match := MACHINE.match(line):
            run["machine"] = f"{match['machine'].strip()}, torch {match['torch']}"
            run["threads"] = int(match["threads"])
            run["commit"] = match["commit"]
            continue
        if match := SPREAD.match(line):
            run["figures"][match["label"].strip()] = {
                "median": _number(match["median"]), "min": _number(match["min"]), "max": _number(match["max"])}
        for match in PAIR.finditer(line):
            run["figures"][match["name"]] = _number(match["value"])
    return run


# A summary figure and the line that gives its spread over the rounds.
PER_ROUND = {"speedup per round": "speedup_vs_transformers"}


def this_machine(argv: list[str]) -> dict:
    """Machine, threads and commit for a bench that does not print them."""
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip() or None
    threads = next((int(value) for flag, value in itertools.pairwise(argv) if flag == "--threads" and value.isdigit()),
                   None)
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
            "threads": threads, "commit": commit}


def result_from_output(bench: str, argv: list[str], text: str, table: str, note: str, date: str,
                       machine: dict | None = None) -> dict:
    parsed = parse_output(text)
    if parsed["machine"] is None and machine is not None:
        parsed.update(machine)
    for spread_name, summary_name in PER_ROUND.items():
        spread, summary = parsed["figures"].get(spread_name), parsed["figures"].get(summary_name)
        if isinstance(spread, dict) and isinstance(summary, (int, float)):
            parsed["figures"][summary_name] = {"median": summary, "min": spread["min"], "max": spread["max"]}
    known = by_table().get(table)
    columns = (known[0].data["columns"] if known else
               [["commit", "run.commit"], ["date", "run.date"], ["torch threads", "run.threads"]]
               + [[name, name] for name in parsed["figures"]])
    command = " ".join(["python -m mini bench", *([bench] if bench != "engine" else []), *argv])
    return {"table": table, "title": known[0].data["title"] if known else command, "command": command,
            "source": f"recorded by python -m book.record from `{command}`",
            "columns": columns,
            "runs": [{"commit": parsed["commit"], "date": date, "machine": parsed["machine"],
                      "threads": parsed["threads"], "note": note, "rows": [parsed["figures"]]}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m book.record", description=__doc__.splitlines()[0])
    parser.add_argument("bench", help="engine, sampler, prefix, spec, ... (as `python -m mini bench <bench>`)")
    parser.add_argument("--table", default=None)
    parser.add_argument("--note", default="")
    args, bench_args = parser.parse_known_args(argv)
    command = [sys.executable, "-m", "mini", "bench", *([args.bench] if args.bench != "engine" else []), *bench_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    if process.wait() != 0:
        print(f"book.record: the bench exited with {process.returncode}; nothing saved", file=sys.stderr)
        return process.returncode
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    result = result_from_output(args.bench, bench_args, "".join(lines), args.table or args.bench, args.note, date,
                                machine=this_machine(bench_args))
    commit = result["runs"][0]["commit"] or "unknown"
    path = save(result, RESULTS_DIR / f"{result['table']}-{date}-{commit}.json")
    print(f"saved {path}; `python -m book.tables` renders it into docs/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
