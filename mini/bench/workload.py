"""The workload every `python -m mini bench` comparison shares, and the lines that report it.

A workload is token windows cut from the Python standard library's own source (the text the shipped model
was trained on) with lengths drawn from fixed ranges and a fixed seed, run greedily with EOS ignored so
every system produces the same number of tokens. Mirrors the role of vllm/benchmarks/datasets/datasets.py
(the request sets `vllm bench` draws) for mini's benchmarks: engine.py (vs transformers), llamacpp.py,
compile.py and profile.py all take their workload and their report header from here.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mini.sampling_params import SamplingParams


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def load_corpus_text(max_bytes: int = 2_000_000) -> str:
    """The Python standard library's own source, read locally (the same text the shipped model saw)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        chunks.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return "\n".join(chunks)


def make_workload(tokenizer, num_prompts: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int],
                  seed: int) -> Workload:
    """Cut `num_prompts` token windows from the corpus; lengths drawn uniformly with a fixed seed."""
    rng = random.Random(seed)
    corpus_ids = tokenizer.encode(load_corpus_text())
    prompts, outs = [], []
    for _ in range(num_prompts):
        length = rng.randint(*prompt_lens)
        start = rng.randrange(0, len(corpus_ids) - length)
        prompts.append(corpus_ids[start:start + length])
        outs.append(rng.randint(*output_lens))
    return Workload(prompts, outs)


def run_mini(llm, workload: Workload, record_steps: bool = False) -> tuple[float, list]:
    """Run the workload through mini; optionally record every step's model inputs for the ceiling."""
    engine = llm.llm_engine
    recorded: list = []   # each step's flat inputs (`ModelRunner.replay_forward` takes one)

    def record_inputs(trace) -> None:   # a step observer (mini/metrics/step_trace.py)
        if trace.inputs is not None:
            recorded.append(trace.inputs)

    remove_observer = engine.add_step_observer(record_inputs) if record_steps else None
    start = time.perf_counter()
    for index, (prompt, out_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=False)):
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True, detokenize=False)
        engine.add_request(f"bench-{index}-{time.monotonic_ns()}", {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - start
    if remove_observer is not None:
        remove_observer()
    return elapsed, recorded


def generate_greedy(llm, workload: Workload) -> tuple[float, list[list[int]]]:
    """`LLM.generate` over the workload (greedy, EOS ignored, exact output lengths): seconds and token ids."""
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
              for n in workload.output_lens]
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in workload.prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def spread(values: list[float]) -> str:
    """'median (min-max)' of one figure's rounds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def side_by_side_kv_args(device: str) -> dict:
    """Engine arguments for one of two engines built in one process on `device`. On CUDA, vLLM's default KV
    budget (0.92 of the card) would give the first engine's cache all of it and leave the second none; a fixed
    2 GiB each holds a benchmark workload many times over. On a CPU the default budget is already bounded."""
    return {"kv_cache_memory_bytes": 2 << 30} if device.startswith("cuda") else {}


def machine_line(threads: int, device: str) -> str:
    """Machine, threads, device and commit: the header every benchmark table in the README quotes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                                cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    gpu = f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""
    return (f"machine: {platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores"
            f"{gpu}; torch {torch.__version__}, {threads} threads; commit {commit}")


# How much of the workload runs, by model: the same shape, scaled to a few minutes on 2 CPU cores.
SHIPPED_MODEL_SIZE = {"num_prompts": 128, "rounds": 3}
REAL_MODEL_SIZE = {"num_prompts": 8, "rounds": 3}
