"""pytest plumbing for the labs: which notebooks to grade, and the learner's answers from them.

    pytest labs/                # grade the learner notebooks in phases/
    pytest labs/ --reference    # grade the source notebooks in solutions/ (must all pass)
    pytest labs/ --notebooks DIR   # grade DIR/NN_topic/NN_topic.ipynb (e.g. a student's submission);
                                   # a phase with no notebook in DIR is skipped as "not submitted"

A lab test asks for the `notebook_path` fixture (`notebook_path("01_paged_kv")`: the notebook to grade, or a
skip when a student did not submit that phase) and grades one exercise of it in a child process
(labs/checks/grading.py).

`-k` selects exactly one exercise by its handle (`-k p01_free_block_queue`, `Exercise.handle`, printed under the
exercise's heading in the notebook); also by its test id (`01_paged_kv::FreeKVCacheBlockQueue`) and its other
names (`Exercise.keywords`: `-k free_block_queue`, or `-k test-free-block-queue`), where those are unique.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# The checks look inside the engines they build (phase 13's InprocEngineCore, views, plugged parts): their
# engine cores run in this process, as `import labs` chooses for the notebooks (mini/engine/core_client.py).
os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "0"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("labs", "course labs")
    group.addoption(
        "--reference",
        action="store_true",
        default=False,
        help="grade the source notebooks in solutions/ instead of phases/",
    )
    group.addoption(
        "--notebooks",
        default=None,
        metavar="DIR",
        help="grade DIR/NN_topic/NN_topic.ipynb instead of phases/",
    )


def notebook_dir(config: pytest.Config) -> Path:
    if config.getoption("--notebooks"):
        return Path(config.getoption("--notebooks")).resolve()
    return REPO_ROOT / ("solutions" if config.getoption("--reference") else "phases")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -k
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from labs.manifest import Exercise

    for item in items:
        callspec = getattr(item, "callspec", None)
        exercise = callspec.params.get("exercise") if callspec is not None else None
        if isinstance(exercise, Exercise):
            item.extra_keyword_matches.update(exercise.keywords)
            item.extra_keyword_matches.add(exercise.handle(callspec.params["assignment_id"]))


def pytest_configure(config: pytest.Config) -> None:
    if config.option.tbstyle == "auto":  # the counterexample message says it all; keep tracebacks short
        config.option.tbstyle = "short"


def pytest_report_header(config: pytest.Config) -> str:
    return f"labs: grading notebooks in {notebook_dir(config)}"


@pytest.fixture(scope="session")
def notebook_path(request: pytest.FixtureRequest):
    """notebook_path(assignment_id) -> the path of that phase's notebook to grade."""
    root = notebook_dir(request.config)

    def find(assignment_id: str) -> Path:
        path = root / assignment_id / f"{assignment_id}.ipynb"
        if not path.is_file():
            if request.config.getoption("--notebooks"):  # a student's folder: the phase was not handed in
                pytest.skip(f"not submitted: {assignment_id} ({path} does not exist)")
            pytest.fail(f"notebook not found: {path}", pytrace=False)
        return path

    return find


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    """One uncut line per failed exercise: the gist of its message (pytest -q's summary cuts it to the width)."""
    gists, not_implemented = [], []
    for report in terminalreporter.stats.get("failed", []):
        if "test_labs.py::test_exercise[" not in report.nodeid:
            continue
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        first_line = message.splitlines()[0].removeprefix("AssertionError: ") if message else ""
        exercise = report.nodeid.rsplit("[", 1)[-1].rstrip("]")
        if first_line.startswith("NotImplementedYet"):
            not_implemented.append(exercise.split("::")[-1])
        else:
            gists.append(f"{exercise}: {first_line}")
    if not (gists or not_implemented):
        return
    terminalreporter.section("labs: what to fix", sep="-")
    for gist in gists:
        terminalreporter.write_line(gist)
    if not_implemented:
        terminalreporter.write_line(f"not implemented yet ({len(not_implemented)}): {', '.join(not_implemented)}")
