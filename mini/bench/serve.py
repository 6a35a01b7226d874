"""`python -m mini bench serve`: the OpenAI server under more and more concurrent streaming clients.

In the spirit of vLLM's benchmarks/benchmark_serving.py (`vllm bench serve`): the server runs in this
process on 127.0.0.1 (uvicorn on a thread, the engine loop on another); for each concurrency level C,
C clients each send streaming /v1/completions requests back to back until the level's requests are done.
Per level: output throughput (generated tokens / wall time), median and p99 time to first token (request
sent -> first non-empty SSE chunk) and inter-token latency (the gap between two SSE chunks, as
benchmark_serving's ITL; one chunk usually holds one token, more when the client lags).
Prompts are random token ids of mixed lengths; `ignore_eos` makes every request generate `--max-tokens`.
A PNG (throughput and latencies against concurrency) is written to `--plot`.
Last line: `peak_tokens_per_s=X p99_ttft_ms_at_16=Y` (nan when 16 is not among the levels).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import struct
import time
import zlib
from dataclasses import dataclass, field

MODEL_NAME = "bench"


@dataclass(slots=True)
class LevelResult:
    concurrency: int
    num_requests: int
    wall_s: float
    output_tokens: int
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


async def one_request(client, prompt_ids: list[int], max_tokens: int) -> tuple[float, list[float], int]:
    """-> (ttft, inter-chunk gaps, completion tokens) of one streamed completion."""
    body = {"model": MODEL_NAME, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    start = time.perf_counter()
    ttft, last, gaps, tokens = math.nan, None, [], 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if not any(choice.get("text") for choice in chunk.get("choices", [])):
                continue
            now = time.perf_counter()
            if last is None:
                ttft = now - start
            else:
                gaps.append(now - last)
            last = now
    return ttft, gaps, tokens


async def run_level(base_url: str, concurrency: int, prompts: list[list[int]], max_tokens: int,
                    timeout_s: float) -> LevelResult:
    import httpx

    queue = list(prompts)
    result = LevelResult(concurrency, len(prompts), 0.0, 0)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        async def worker() -> None:
            while queue:
                prompt = queue.pop()
                ttft, gaps, tokens = await one_request(client, prompt, max_tokens)
                result.ttfts_s.append(ttft)
                result.itls_s.extend(gaps)
                result.output_tokens += tokens

        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout_s)
        result.wall_s = time.perf_counter() - start
    return result


def make_prompts(count: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


# ---------------------------------------------------------------------------- the PNG (no plotting library:
# mini/ stays free of the course's plotting stack, tests/engine/test_boundary.py)
PLOT_W, PLOT_H, MARGIN = 360, 260, 24
COLORS = {"throughput": (31, 119, 180), "ttft_p50": (31, 119, 180), "ttft_p99": (158, 202, 225),
          "itl_p50": (255, 127, 14), "itl_p99": (253, 208, 162), "axis": (60, 60, 60), "grid": (225, 225, 225)}


def _png_bytes(pixels: list[bytearray], width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]

    def dot(self, x: int, y: int, color: tuple[int, int, int], radius: int = 1) -> None:
        for yy in range(y - radius, y + radius + 1):
            for xx in range(x - radius, x + radius + 1):
                if 0 <= xx < self.width and 0 <= yy < self.height:
                    self.pixels[yy][3 * xx:3 * xx + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int], radius: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for step in range(steps + 1):
            self.dot(round(x0 + (x1 - x0) * step / steps), round(y0 + (y1 - y0) * step / steps), color, radius)


def _panel(canvas: _Canvas, left: int, xs: list[float], series: dict[str, list[float]], log_y: bool) -> None:
    """One chart: x = log2(concurrency), y linear (from 0) or log; grid lines at each level, axes, lines."""
    x0, x1, y0, y1 = left + MARGIN, left + PLOT_W - MARGIN // 2, PLOT_H - MARGIN, MARGIN // 2
    values = [v for ys in series.values() for v in ys if v > 0 and math.isfinite(v)]
    if not values:
        return
    def ty(v: float) -> float:
        return math.log10(v) if log_y else v
    low = ty(min(values)) - 0.1 if log_y else 0.0
    high = ty(max(values)) + 0.1 if log_y else 1.05 * max(values)
    lx = [math.log2(x) for x in xs]
    span_x = (lx[-1] - lx[0]) or 1.0

    def px(i: int) -> int:
        return round(x0 + (lx[i] - lx[0]) / span_x * (x1 - x0))

    def py(v: float) -> int:
        return round(y0 - (ty(v) - low) / ((high - low) or 1.0) * (y0 - y1))

    for i in range(len(xs)):
        canvas.line(px(i), y0, px(i), y1, COLORS["grid"], 0)
    canvas.line(x0, y0, x1, y0, COLORS["axis"], 0)
    canvas.line(x0, y0, x0, y1, COLORS["axis"], 0)
    for name, ys in series.items():
        points = [(px(i), py(v)) for i, v in enumerate(ys) if v > 0 and math.isfinite(v)]
        for (ax, ay), (bx, by) in itertools.pairwise(points):
            canvas.line(ax, ay, bx, by, COLORS[name], 1)
        for x, y in points:
            canvas.dot(x, y, COLORS[name], 3)


def plot(results: list[LevelResult], path: str) -> str:
    """Write the PNG; -> the caption saying what it shows (the image itself carries no text)."""
    xs = [float(r.concurrency) for r in results]
    canvas = _Canvas(2 * PLOT_W, PLOT_H)
    _panel(canvas, 0, xs, {"throughput": [r.tokens_per_s for r in results]}, log_y=False)
    _panel(canvas, PLOT_W, xs, {
        "ttft_p50": [1000 * percentile(r.ttfts_s, 50) for r in results],
        "ttft_p99": [1000 * percentile(r.ttfts_s, 99) for r in results],
        "itl_p50": [1000 * percentile(r.itls_s, 50) for r in results],
        "itl_p99": [1000 * percentile(r.itls_s, 99) for r in results]}, log_y=True)
    with open(path, "wb") as out:
        out.write(_png_bytes(canvas.pixels, canvas.width, canvas.height))
    levels = ",".join(str(r.concurrency) for r in results)
    return (f"{path}: x = concurrent clients {levels} (log scale, one grid line each); left: output tokens/s "
            "(linear from 0); right, log ms: TTFT p50 dark blue, p99 light blue; ITL p50 dark orange, p99 light orange")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini bench serve", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF folder, .gguf or offline hub id (default: shipped)")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32", help="comma-separated levels")
    parser.add_argument("--requests-per-level", type=int, default=0,
                        help="requests per level (default: 2 x concurrency, at least 8)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--min-prompt-len", type=int, default=16)
    parser.add_argument("--max-prompt-len", type=int, default=96)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--plot", default="bench_serve.png", help="where to save the PNG")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per level at most")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    levels = sorted({int(level) for level in args.concurrency.split(",") if level.strip()})
    if not levels or levels[0] < 1:
        raise SystemExit(f"--concurrency must list positive ints, got {args.concurrency!r}")

    from mini.engine.async_llm import AsyncLLM
    from mini.entrypoints.openai.api_server import build_app, serve_in_thread

    engine = AsyncLLM.from_engine_args(model=args.model, max_num_seqs=args.max_num_seqs,
                                       max_num_batched_tokens=args.max_num_batched_tokens, device=args.device)
    vocab_size = engine.engine.vocab_size
    results: list[LevelResult] = []
    with serve_in_thread(build_app(engine, MODEL_NAME)) as base_url:
        warm = make_prompts(2, args.min_prompt_len, args.max_prompt_len, vocab_size, args.seed + 999)
        asyncio.run(run_level(base_url, 2, warm, 4, args.timeout))
        print(f"{'clients':>7} {'reqs':>5} {'tok/s':>9} {'ttft p50':>9} {'ttft p99':>9} {'itl p50':>8} "
              f"{'itl p99':>8}  (ms)")
        for index, level in enumerate(levels):
            count = args.requests_per_level or max(8, 2 * level)
            prompts = make_prompts(count, args.min_prompt_len, args.max_prompt_len, vocab_size, args.seed + index)
            result = asyncio.run(run_level(base_url, level, prompts, args.max_tokens, args.timeout))
            results.append(result)
            print(f"{level:>7} {count:>5} {result.tokens_per_s:>9.1f} "
                  f"{1000 * statistics.median(result.ttfts_s):>9.1f} {1000 * percentile(result.ttfts_s, 99):>9.1f} "
                  f"{1000 * percentile(result.itls_s, 50):>8.1f} {1000 * percentile(result.itls_s, 99):>8.1f}",
                  flush=True)
    print(f"plot: {plot(results, args.plot)}")
    at_16 = next((r for r in results if r.concurrency == 16), None)
    p99_ttft_16 = 1000 * percentile(at_16.ttfts_s, 99) if at_16 is not None else math.nan
    print(f"peak_tokens_per_s={max(r.tokens_per_s for r in results):.1f} p99_ttft_ms_at_16={p99_ttft_16:.1f}")
