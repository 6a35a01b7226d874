"""Write the committed index of the pinned vLLM release: every Python file under `vllm/`, the classes,
functions and methods each defines (with line numbers), and the fields and defaults of the classes whose
names mini's public API borrows (SamplingParams, the engine arguments, the server's flags and the OpenAI
request bodies).

Maintainers only; nothing at run time or in the tests downloads anything. Usage:

    python scripts/vllm_index.py                 # downloads the sdist once (pip download), then indexes it
    python scripts/vllm_index.py --source DIR    # index an unpacked tree (DIR holds vllm/)
    python scripts/vllm_index.py --keep DIR      # also leave the unpacked tree in DIR: set MINI_VLLM_SOURCE=DIR
                                                 # to run tests/course/vllm_answers/ (vLLM's own code
                                                 # through the lab checks; they skip without it)

`tests/test_vllm_citations.py` reads the index (`tests/data/vllm_index.json.gz`) to check every `vllm/...`
path, `path:line` and `path` + symbol cited by the notebooks, the README and mini's docstrings, and
`tests/test_vllm_api_subset.py` reads its `fields` to check that mini's public names are vLLM's.
"""

from __future__ import annotations

import argparse
import ast
import glob
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VLLM_VERSION = "0.33.0"
INDEX_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_index.json.gz"

# (file, class): the classes whose fields (name -> default, as source text) the API-subset test reads.
FIELD_CLASSES = [
    ("vllm/sampling_params.py", "SamplingParams"),
    ("vllm/sampling_params.py", "StructuredOutputsParams"),
    ("vllm/sampling_params.py", "BeamSearchParams"),
    ("vllm/engine/arg_utils.py", "EngineArgs"),
    ("vllm/entrypoints/common/cli_args.py", "BaseFrontendArgs"),
    ("vllm/entrypoints/common/cli_args.py", "FrontendArgs"),
    ("vllm/entrypoints/openai/completion/protocol.py", "CompletionRequest"),
    ("vllm/entrypoints/openai/chat_completion/protocol.py", "ChatCompletionRequest"),
    ("vllm/config/cache.py", "CacheConfig"),
    ("vllm/config/scheduler.py", "SchedulerConfig"),
    ("vllm/config/compilation.py", "CompilationConfig"),
    ("vllm/config/speculative.py", "SpeculativeConfig"),
    ("vllm/config/parallel.py", "ParallelConfig"),
    ("vllm/config/model.py", "ModelConfig"),
    ("vllm/config/attention.py", "AttentionConfig"),
]


def _symbols(tree: ast.Module) -> list[list]:
    """[qualified name, line] for every class, function and method (nested ones too) and every class attribute
    (fields, enum members), in file order."""
    found: list[list] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append([name, child.lineno])   # the `def` / `class` line, after any decorators
                visit(child, f"{name}.")
            elif isinstance(child, (ast.If, ast.Try)):
                visit(child, prefix)          # definitions under `if TYPE_CHECKING:` / try-import blocks
            elif prefix and isinstance(node, ast.ClassDef) and isinstance(child, (ast.Assign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                found.extend([f"{prefix}{t.id}", child.lineno] for t in targets if isinstance(t, ast.Name))

    visit(tree, "")
    return found


def _module_names(tree: ast.Module) -> list[str]:
    """Module-level assigned names (constants such as NONE_HASH), for `path` + symbol citations."""
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _default_source(value: ast.expr | None) -> str | None:
    """A field's default as source text: `x: int = 3` -> "3"; `Field(default=3, ...)`, `field(default=3)` ->
    "3"; `field(default_factory=list)` -> "list()"; no default -> None."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in {"Field", "field"}:
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
            if keyword.arg == "default_factory":
                return f"{ast.unparse(keyword.value)}()"
        return ast.unparse(value.args[0]) if value.args else None
    return ast.unparse(value)


def _fields(tree: ast.Module, class_name: str, source: str) -> dict[str, str | None]:
    """name -> default (see _default_source) of a class body's annotated fields."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            out: dict[str, str | None] = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out[item.target.id] = _default_source(item.value)
            return out
    raise SystemExit(f"{class_name} not found: update FIELD_CLASSES for this release")


def build_index(root: Path) -> dict:
    files: dict[str, dict] = {}
    fields: dict[str, dict] = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            files[rel] = {"lines": source.count("\n") + 1, "symbols": [], "names": []}
            continue
        files[rel] = {"lines": source.count("\n") + 1, "symbols": _symbols(tree), "names": _module_names(tree)}
    for rel, class_name in FIELD_CLASSES:
        source = (root / rel).read_text(encoding="utf-8")
        fields[f"{rel}::{class_name}"] = _fields(ast.parse(source), class_name, source)
    return {"vllm_version": VLLM_VERSION, "files": files, "fields": fields}


def _download() -> Path:
    work = Path(tempfile.mkdtemp(prefix="vllm-sdist-"))
    # Building the sdist fails (it needs CUDA tooling); --no-clean keeps the unpacked tree all the same.
    subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={VLLM_VERSION}", "--no-deps",
                    "--no-binary", ":all:", "--no-clean", "-d", str(work)], check=False)
    candidates = sorted(glob.glob(f"{tempfile.gettempdir()}/pip-download-*/vllm_*/vllm/__init__.py"),
                        key=lambda p: Path(p).stat().st_mtime)
    if not candidates:
        raise SystemExit("pip left no unpacked vllm tree; pass --source DIR")
    return Path(candidates[-1]).parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="an unpacked vLLM tree (the folder that holds vllm/)")
    parser.add_argument("--out", type=Path, default=INDEX_PATH)
    parser.add_argument("--keep", type=Path, help="copy the unpacked tree's vllm/ here (for MINI_VLLM_SOURCE)")
    args = parser.parse_args()
    root = args.source or _download()
    index = build_index(root)
    if args.keep is not None:
        shutil.copytree(root / "vllm", args.keep / "vllm", dirs_exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    with gzip.GzipFile(args.out, "wb", mtime=0) as out:   # mtime=0: the same tree gives the same bytes
        out.write(payload)
    symbols = sum(len(f["symbols"]) for f in index["files"].values())
    print(f"vllm {VLLM_VERSION}: {len(index['files'])} files, {symbols} symbols -> {args.out} "
          f"({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
