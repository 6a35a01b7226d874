"""The `mini` command line: `python -m mini generate|chat|serve|bench ...`.

Mirrors vllm/entrypoints/cli/main.py (the `vllm` command with its subcommands), reduced to the
subcommands a learner needs: generate text from the shipped (or a local) model, chat with a model
interactively (mini/entrypoints/chat_cli.py), serve it over an OpenAI-compatible HTTP API
(mini/entrypoints/openai/api_server.py, `vllm serve`), and run benchmarks.
"""

from __future__ import annotations

import argparse
import os
import sys

from mini.config import add_engine_arguments, cli_engine_args

# The engine arguments `generate` takes, each generated from its EngineConfig field (mini/config.py).
GENERATE_ENGINE_ARGS = ("speculative_config", "device", "dtype", "block_size", "attention_backend", "enforce_eager",
                        "tensor_parallel_size", "async_scheduling")
BENCHMARKS = {
    "engine": "mini.bench.engine",
    "sampler": "mini.bench.sampler",
    "prefix": "mini.bench.prefix",
    "attention": "mini.bench.attention",
    "structured": "mini.bench.structured",
    "serve": "mini.bench.serve",
    "spec": "mini.bench.spec",
    "profile": "mini.bench.profile",
    "gpu": "mini.bench.gpu",
    "compile": "mini.bench.compile",
    "distributed": "mini.bench.distributed",
    "async_scheduling": "mini.bench.async_scheduling",
    "lora": "mini.bench.lora",
    "ppl": "mini.bench.ppl",
    "agreement": "mini.bench.agreement",
    "quant_kernels": "mini.bench.quant_kernels",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a completion for one or more prompts")
    gen.add_argument("prompts", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--model", default=None, help="local HF folder, .gguf file or offline hub id such as "
                     "HuggingFaceTB/SmolLM2-135M-Instruct (default: the shipped tiny model)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    add_engine_arguments(gen, GENERATE_ENGINE_ARGS)

    sub.add_parser("chat", add_help=False,
                   help="interactive chat that streams replies: `chat [MODEL] [--help | options]`")
    sub.add_parser("serve", add_help=False,
                   help="an OpenAI-compatible HTTP server: `serve [MODEL] [--host H] [--port P] [--help | options]`")
    sub.add_parser("bench", add_help=False,
                   help="benchmarks: `bench [engine|sampler|attention|prefix|structured|serve|spec|profile|gpu|"
                        "compile|distributed|async_scheduling|lora|ppl|agreement|quant_kernels] [--help | options]` "
                        "(engine by default)")
    return parser


def run_bench(argv: list[str]) -> int:
    """Dispatch `bench [NAME] [options]` to mini.bench.NAME.main(options)."""
    import importlib

    which, rest = "engine", argv
    if argv and not argv[0].startswith("-"):
        which, rest = argv[0], argv[1:]
    if which not in BENCHMARKS:
        print(f"error: unknown benchmark {which!r}; choose from {sorted(BENCHMARKS)}", file=sys.stderr)
        return 2
    returned = importlib.import_module(BENCHMARKS[which]).main(rest)
    return returned if isinstance(returned, int) else 0


def run_generate(args: argparse.Namespace) -> int:
    from mini import LLM, SamplingParams

    try:
        params = SamplingParams(
            n=args.n, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            seed=args.seed, max_tokens=args.max_tokens, stop=args.stop, ignore_eos=args.ignore_eos,
        )
        llm = LLM(model=args.model, **cli_engine_args(args, GENERATE_ENGINE_ARGS))
        outputs = llm.generate(args.prompts, params, use_tqdm=False)
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for output in outputs:
        for completion in output.outputs:
            header = f"--- prompt {output.request_id}" + (f", sample {completion.index}" if args.n > 1 else "")
            print(f"{header} (finish_reason={completion.finish_reason}, {len(completion.token_ids)} tokens)")
            print(output.prompt + completion.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        return run_bench(argv[1:])
    if argv and argv[0] == "serve":
        from mini.entrypoints.openai.api_server import main as serve_main

        return serve_main(argv[1:])
    if argv and argv[0] == "chat":
        from mini.entrypoints.chat_cli import main as chat_main

        return chat_main(argv[1:])
    args = build_parser().parse_args(argv)
    return run_generate(args)


if __name__ == "__main__":
    sys.exit(main())
