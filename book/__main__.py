"""`python -m book build ...` (the site), `python -m book tables` (benchmark tables), `python -m book record`."""

import sys

from book import build, record, tables

COMMANDS = {"build": build.main, "tables": tables.main, "record": record.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print("usage: python -m book build|tables|record [options]", file=sys.stderr)
        sys.exit(2)
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
