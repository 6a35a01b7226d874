"""Mirrors no vllm/v1 file: every citation of vLLM's source in the course and the engine, checked against the
committed index of the pinned release (`tests/data/vllm_index.json.gz`, written by `scripts/vllm_index.py`).

What counts as a citation (in the solutions notebooks, the README, `docs/`, `labs/` and `mini/`):

* a path, `vllm/v1/core/block_pool.py` (or a folder, `vllm/v1/core/`): it must exist in the release;
* a path and a line, `vllm/v1/core/block_pool.py:792`: the file must have that line;
* a path and a symbol, `vllm/v1/core/block_pool.py::BlockPool.touch`, or a path and a line and a symbol,
  `vllm/v1/core/block_pool.py:792::BlockPool.touch`: the symbol (a class, a function, a method, a class
  attribute or a module-level name; `touch` or `BlockPool.touch`) must be defined in that file, and the line
  must be at most `LINE_SLACK` lines from its definition;
* a path given to vLLM without its `vllm/` prefix (`model_loader/gguf_loader.py` written after "vLLM's"; a path with a
  folder right after "vLLM's" or "vLLM"): it is reported either way, as missing from the release or with the
  full path to write instead (vLLM's repository folders beside `vllm/`, such as `benchmarks/`, are not indexed);
* prose that ties a code-like name to a path: "`BlockPool.touch` in `vllm/v1/core/block_pool.py`",
  "`BlockPool` (`vllm/v1/core/block_pool.py`)" or "`vllm/v1/core/block_pool.py`'s `touch()`". Only names that
  look like definitions are read this way (CamelCase, dotted, or written with `()`), so a variable named in
  passing is not taken for a symbol.

    python -m labs.course citations     # list every broken citation, file by file (exit 1 if any)
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INDEX_PATH = REPO_ROOT / "tests" / "data" / "vllm_index.json.gz"
LINE_SLACK = 5

_PATH = r"vllm/[A-Za-z0-9_/]*[A-Za-z0-9_](?:\.py)?/?"
_CITATION = re.compile(rf"(?<![\w/.-])(?P<path>{_PATH})(?::(?P<line>\d+))?(?:::(?P<symbol>[A-Za-z_][\w.]*))?")
_CODE_NAME = r"[A-Za-z_][\w.]*(?:\(\))?"
# A path with a folder and no `vllm/` (nor this project's own roots) that a line gives to vLLM.
_BARE_PATH = re.compile(r"(?<![\w/.-])(?P<path>[A-Za-z0-9_][\w.-]*/[\w/.-]*\w\.py)\b")
_UNCHECKED_ROOTS = ("vllm/", "mini/", "labs/", "tests/", "scripts/", "solutions/", "phases/", "docs/", ".ci/",
                    "benchmarks/", "examples/")
_ATTRIBUTED = re.compile(r"\bvLLM(?:'s)?\s*`?$")
# "`Sym` in `path`", "`Sym` (`path`)", "`path`'s `Sym`", "`path` (`Sym`)"
_TIED = [
    re.compile(rf"`(?P<symbol>{_CODE_NAME})` (?:in|of|from) `(?P<path>{_PATH})(?::\d+)?`"),
    re.compile(rf"`(?P<symbol>{_CODE_NAME})` \(`(?P<path>{_PATH})(?::\d+)?`"),
    re.compile(rf"`(?P<path>{_PATH})(?::\d+)?`'s `(?P<symbol>{_CODE_NAME})`"),
    re.compile(rf"`(?P<path>{_PATH})(?::\d+)?` \(`(?P<symbol>{_CODE_NAME})`\)"),
]


@dataclass(frozen=True, slots=True)
class BrokenCitation:
    where: str            # file (and cell) that cites it
    citation: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.citation}: {self.reason}"


@functools.cache
def load_index(path: Path = INDEX_PATH) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _looks_like_definition(name: str) -> bool:
    bare = name.removesuffix("()")
    return name.endswith("()") or "." in bare or (bare[:1].isupper() and any(c.islower() for c in bare))


def _symbol_lines(entry: dict, symbol: str) -> list[int]:
    """Lines where `symbol` (qualified or its last parts) is defined in one indexed file; [] if nowhere.
    A module-level name has line 0 (the index keeps no line for it)."""
    symbol = symbol.removesuffix("()")
    lines = [line for name, line in entry["symbols"] if name == symbol or name.endswith("." + symbol)]
    if not lines and symbol in entry["names"]:
        lines = [0]
    return lines


def check_text(text: str, where: str, index: dict | None = None) -> list[BrokenCitation]:  # noqa: C901 - one branch per citation form
    """Every broken vLLM citation in `text`."""
    index = index or load_index()
    files: dict = index["files"]
    folders = {p.rsplit("/", 1)[0] + "/" for p in files} | {"vllm/"}
    folders |= {f[: i + 1] for f in list(folders) for i, c in enumerate(f) if c == "/"}
    broken: list[BrokenCitation] = []

    def bad(citation: str, reason: str) -> None:
        broken.append(BrokenCitation(where, citation, reason))

    for match in _CITATION.finditer(text):
        path, line, symbol = match["path"], match["line"], match["symbol"]
        if path.endswith("/") or not path.endswith(".py"):
            if path.rstrip("/") + "/" not in folders and path + ".py" not in files:
                bad(match[0], f"no such folder or file in vLLM {index['vllm_version']}")
            continue
        entry = files.get(path)
        if entry is None:
            bad(match[0], f"no such file in vLLM {index['vllm_version']}")
            continue
        if line is not None and not 1 <= int(line) <= entry["lines"]:
            bad(match[0], f"line {line} is past the end of the file ({entry['lines']} lines)")
        if symbol is not None:
            lines = _symbol_lines(entry, symbol)
            if not lines:
                bad(match[0], f"{path} defines no {symbol}")
            elif line is not None and lines != [0] and min(abs(int(line) - n) for n in lines) > LINE_SLACK:
                bad(match[0], f"{symbol} is defined at line(s) {lines}, not near {line}")
    for match in _BARE_PATH.finditer(text):
        path = match["path"]
        if path.startswith(_UNCHECKED_ROOTS) or not _ATTRIBUTED.search(text[max(0, match.start() - 12):match.start()]):
            continue
        full = sorted(f for f in files if f.endswith("/" + path))
        bad(path, f"write vLLM's paths in full: {' or '.join(full)}" if full
            else f"no file of vLLM {index['vllm_version']} ends with {path}")
    for pattern in _TIED:
        for match in pattern.finditer(text):
            path, symbol = match["path"], match["symbol"]
            entry = files.get(path)
            if entry is None or not _looks_like_definition(symbol):
                continue   # a missing file is reported above; a plain word is not taken for a symbol
            if not _symbol_lines(entry, symbol):
                bad(match[0], f"{path} defines no {symbol.removesuffix('()')}")
    return broken


def cited_sources() -> dict[str, str]:
    """{where: text} for everything that cites vLLM: solutions notebooks (cell by cell), README.md, the guides
    in docs/, every .py and .md under mini/ and labs/."""
    sources: dict[str, str] = {}
    for notebook in sorted((REPO_ROOT / "solutions").glob("*/*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        for number, cell in enumerate(cells):
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            sources[f"{notebook.relative_to(REPO_ROOT)} cell {number} ({cell.get('id', '?')})"] = source
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")),
                 *sorted((REPO_ROOT / "mini").rglob("*.py")),
                 *sorted((REPO_ROOT / "mini").rglob("*.md")), *sorted((REPO_ROOT / "labs").rglob("*.py")),
                 *sorted((REPO_ROOT / "labs").rglob("*.md"))]:
        sources[str(path.relative_to(REPO_ROOT))] = path.read_text(encoding="utf-8")
    return sources


def find_broken_citations() -> list[BrokenCitation]:
    index = load_index()
    return [b for where, text in cited_sources().items() for b in check_text(text, where, index)]
