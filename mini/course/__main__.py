"""Mirrors no vllm/v1 file: the course's command line.

    python -m mini.course release   # normalize solutions/, regenerate phases/ with nbgrader
    python -m mini.course check     # exit 1 and list the files if phases/ drifted from solutions/
    python -m mini.course list      # the phases (assignment ids) found in solutions/
"""

from __future__ import annotations

import argparse
import sys

from mini.course.release import find_drift, list_assignments, release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini.course", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["release", "check", "list"])
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(list_assignments()))
        return 0
    if args.command == "release":
        changed = release()
        print("\n".join(changed) if changed else "phases/ already up to date")
        return 0
    drift = find_drift()
    print(drift.describe())
    return 0 if drift.is_clean() else 1


if __name__ == "__main__":
    sys.exit(main())
