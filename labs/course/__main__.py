"""Mirrors no vllm/v1 file: the course's command line.

    python -m labs.course release [NN_topic ...]  # normalize solutions/, regenerate phases/ with nbgrader
    python -m labs.course check [NN_topic ...]    # exit 1 and list the files if phases/ drifted
    python -m labs.course list                    # the phases (assignment ids) found in solutions/
    python -m labs.course citations               # exit 1 and list every vLLM citation the pinned release lacks

With no NN_topic, every phase in solutions/ is processed (and stale phases/ files are deleted). `check`
counts only what the release controls: your answers, outputs, added cells and the kernel metadata
JupyterLab writes are listed as your work, never as drift. `--root DIR` works on another copy of the course.
Run it with the course's environment (`. .venv/bin/activate`, or `.venv/bin/python -m labs.course ...`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from labs.course.release import REPO_ROOT, CourseToolsMissing, find_drift, list_assignments, release
except ImportError as error:  # nbformat / nbgrader missing: not the course's Python
    raise SystemExit(
        f"python -m labs.course: {error}. This Python ({sys.executable}) is not the course's environment: "
        "activate it first (`. .venv/bin/activate`, made by `bash scripts/setup.sh`) or run "
        "`.venv/bin/python -m labs.course ...`"
    ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs.course", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["release", "check", "list", "citations"])
    parser.add_argument("assignment_ids", nargs="*", metavar="NN_topic", help="only these phases")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the course folder (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except CourseToolsMissing as error:
        print(f"python -m labs.course {args.command}: {error}", file=sys.stderr)
        return 2


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    root = args.root.resolve()
    known = list_assignments(root)
    unknown = [a for a in args.assignment_ids if a not in known]
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; phases in solutions/: {known}")
    ids = args.assignment_ids or None
    if args.command == "citations":
        from labs.course.vllm_citations import find_broken_citations

        broken = find_broken_citations()
        print("\n".join(map(str, broken)) if broken else "every vLLM citation exists in the pinned release")
        return 1 if broken else 0
    if args.command == "list":
        print("\n".join(known))
        return 0
    if args.command == "release":
        changed = release(root, assignment_ids=ids)
        print("\n".join(changed) if changed else "phases/ already up to date")
        return 0
    drift = find_drift(root, assignment_ids=ids)
    print(drift.describe())
    return 0 if drift.is_clean() else 1


if __name__ == "__main__":
    sys.exit(main())
