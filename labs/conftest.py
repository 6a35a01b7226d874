"""pytest plumbing for the labs: which notebooks to grade, and the learner's answers from them.

    pytest labs/                # grade the learner notebooks in phases/
    pytest labs/ --reference    # grade the source notebooks in solutions/ (must all pass)
    pytest labs/ --notebooks DIR   # grade DIR/NN_topic/NN_topic.ipynb (e.g. a student's submission)

A lab test asks for the `answers` fixture and calls `answers("01_paged_kv").get("name")`: the
object the learner defined in that notebook's answer cell, or an AssertionError that says why not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labs.course.answers import NotebookAnswers, load_answers

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def pytest_configure(config: pytest.Config) -> None:
    if config.option.tbstyle == "auto":  # the counterexample message says it all; keep tracebacks short
        config.option.tbstyle = "short"


def pytest_report_header(config: pytest.Config) -> str:
    return f"labs: grading notebooks in {notebook_dir(config)}"


@pytest.fixture(scope="session")
def answers(request: pytest.FixtureRequest):
    """answers(assignment_id) -> NotebookAnswers of that phase's notebook (loaded once)."""
    root = notebook_dir(request.config)
    loaded: dict[str, NotebookAnswers] = {}

    def load(assignment_id: str) -> NotebookAnswers:
        if assignment_id not in loaded:
            path = root / assignment_id / f"{assignment_id}.ipynb"
            if not path.is_file():
                pytest.fail(f"notebook not found: {path}", pytrace=False)
            loaded[assignment_id] = load_answers(path)
        return loaded[assignment_id]

    return load
