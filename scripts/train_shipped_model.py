"""Train the tiny Llama (and its draft model) that ships inside ``mini/assets``.

No vLLM counterpart: vLLM serves checkpoints trained elsewhere. This script makes the small
checkpoint that `mini` runs by default, fully offline and seeded:

1. gather a corpus: the running interpreter's standard-library ``*.py`` files;
2. train a byte-level BPE tokenizer on it (lossless on any unicode text);
3. train a ~3M-parameter Llama with grouped-query attention, then a 2-layer draft model
   with the same tokenizer (for speculative decoding);
4. save both as Hugging Face folders (``config.json``, ``model.safetensors``, tokenizer files),
   so both `mini` and `transformers` load them, plus ``training_log.json``.

Retrain with ``python -m scripts.train_shipped_model`` (about 7 minutes on 2 idle CPU cores;
under heavy CPU contention ``--threads 1`` is several times faster than 2 threads).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
SKIPPED_STDLIB_DIRS = frozenset({
    "test", "tests", "idlelib", "site-packages", "lib2to3", "tkinter", "turtledemo",
    "encodings", "pydoc_data", "ensurepip", "__pycache__", "lib-dynload",
})


@dataclass(slots=True)
class ModelShape:
    """The architecture knobs of one trained model (everything else is LlamaConfig's default)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int


MAIN_SHAPE = ModelShape(hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
                        num_key_value_heads=2, intermediate_size=512)
DRAFT_SHAPE = ModelShape(hidden_size=192, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, intermediate_size=512)


def gather_corpus(max_file_bytes: int) -> list[str]:
    """Stdlib sources, sorted by path; each cut to ``max_file_bytes`` at a line boundary."""
    stdlib_root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(stdlib_root.rglob("*.py")):
        relative = path.relative_to(stdlib_root)
        if set(relative.parts[:-1]) & SKIPPED_STDLIB_DIRS or relative.parts[0].startswith("config-"):
            continue
        if path.name.startswith("_sysconfigdata"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) > max_file_bytes:
            text = text[: text.rfind("\n", 0, max_file_bytes) + 1]
        if text.strip():
            documents.append(text)
    return documents


def split_documents(documents: list[str], eval_every: int) -> tuple[list[str], list[str]]:
    """Every ``eval_every``-th document is held out for the eval loss."""
    train = [doc for index, doc in enumerate(documents) if index % eval_every != 0]
    held_out = [doc for index, doc in enumerate(documents) if index % eval_every == 0]
    return train, held_out


def train_tokenizer(documents: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style): every string round-trips exactly, emoji and CJK included."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN], min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, bos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN, model_max_length=1024, clean_up_tokenization_spaces=False,
    )


def encode_documents(tokenizer: PreTrainedTokenizerFast, documents: list[str]) -> torch.Tensor:
    """One flat stream of token ids: every document followed by the end-of-text token."""
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(documents):
        ids.extend(encoding.ids)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def build_model(shape: ModelShape, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=1024, rope_theta=10000.0,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **asdict(shape),
    )
    return LlamaForCausalLM(config)


def sample_batch(stream: torch.Tensor, batch_size: int, context: int, generator: torch.Generator):
    starts = torch.randint(0, len(stream) - context - 1, (batch_size,), generator=generator)
    windows = torch.stack([stream[start: start + context + 1] for start in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak_lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


def loss_of(model: LlamaForCausalLM, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, stream: torch.Tensor, context: int, max_windows: int = 64) -> float:
    """Mean loss over consecutive, non-overlapping held-out windows."""
    model.eval()
    num_windows = min(max_windows, (len(stream) - 1) // context)
    windows = stream[: num_windows * context + 1]
    inputs = windows[:-1].view(num_windows, context)
    targets = windows[1:].view(num_windows, context)
    losses = [loss_of(model, inputs[i: i + 16], targets[i: i + 16]).item() for i in range(0, num_windows, 16)]
    model.train()
    return sum(losses) / len(losses)


def train(model: LlamaForCausalLM, stream: torch.Tensor, args: argparse.Namespace, steps: int,
          seed: int, label: str) -> tuple[float, float, int]:
    """AdamW + warmup/cosine on random windows; returns (final train loss, seconds, steps run)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    started, recent_losses = time.perf_counter(), []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, args.lr, warmup_steps=min(100, steps // 10 + 1))
        inputs, targets = sample_batch(stream, args.batch_size, args.context, generator)
        loss = loss_of(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent_losses = (recent_losses + [loss.item()])[-20:]
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - started
            print(f"[{label}] step {step + 1}/{steps} loss {loss.item():.3f} {elapsed:.0f}s", flush=True)
    return sum(recent_losses) / len(recent_losses), time.perf_counter() - started, steps


def steps_for_minutes(model: LlamaForCausalLM, stream: torch.Tensor, args: argparse.Namespace,
                      minutes: float) -> int:
    """Turn a wall-time budget into a step count by timing a few steps on a throwaway copy."""
    probe = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    timings = []
    for _ in range(4):
        started = time.perf_counter()
        loss_of(probe, *sample_batch(stream, args.batch_size, args.context, generator)).backward()
        timings.append(time.perf_counter() - started)
    seconds_per_step = 1.1 * sorted(timings[1:])[1]   # median of the warm steps, + optimizer overhead
    return max(10, int(minutes * 60 / seconds_per_step))


def greedy_continuation(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, prompt: str,
                        max_new_tokens: int = 64) -> str:
    model.eval()
    input_ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        output = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, input_ids.shape[1]:])


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def make_tokenizer_config_portable(folder: Path) -> None:
    """transformers 5 writes its own class name; 4.x only knows the (equivalent) PreTrainedTokenizerFast."""
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def save_folder(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, folder: Path,
                log: dict) -> None:
    """A Hugging Face folder: config, safetensors weights, generation config, tokenizer, log."""
    folder.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    make_tokenizer_config_portable(folder)
    special_tokens = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN,
                      "unk_token": EOS_TOKEN}
    (folder / "special_tokens_map.json").write_text(json.dumps(special_tokens, indent=2) + "\n")
    log_path = folder / "training_log.json"
    log_path.write_text(json.dumps(log, indent=2) + "\n")
    log["size_on_disk_bytes"] = folder_bytes(folder)   # counts the log too (rewritten just below)
    log_path.write_text(json.dumps(log, indent=2) + "\n")


def reproduce_command(args: argparse.Namespace, label: str, steps: int) -> str:
    """The command that retrains this model with the same step count (no wall-time budget)."""
    step_flag = "--draft-only --draft-steps" if label.endswith("draft") else "--main-steps"
    return (f"python -m scripts.train_shipped_model --seed {args.seed} --threads {args.threads} "
            f"--lr {args.lr:g} --max-file-bytes {args.max_file_bytes} --batch-size {args.batch_size} "
            f"--context {args.context} --vocab-size {args.vocab_size} {step_flag} {steps}")


def train_and_save(shape: ModelShape, steps: int, minutes: float | None, folder: Path, label: str,
                   tokenizer: PreTrainedTokenizerFast, streams: dict[str, torch.Tensor],
                   corpus_info: dict, args: argparse.Namespace) -> dict:
    model = build_model(shape, tokenizer, args.seed)
    if minutes is not None:
        steps = steps_for_minutes(model, streams["train"], args, minutes)
    final_train_loss, seconds, steps = train(model, streams["train"], args, steps, args.seed, label)
    num_params = sum(parameter.numel() for parameter in model.parameters())
    log = {
        "model": label, "parameters": num_params, "shape": asdict(shape), "vocab_size": len(tokenizer),
        "train_seconds": round(seconds, 1), "steps": steps, "batch_size": args.batch_size,
        "context": args.context, "peak_lr": args.lr, "tokens_seen": steps * args.batch_size * args.context,
        "final_train_loss": round(final_train_loss, 4),
        "final_eval_loss": round(evaluate(model, streams["eval"], args.context), 4),
        **corpus_info, "seed": args.seed, "torch_threads": torch.get_num_threads(),
        "command": "python -m scripts.train_shipped_model " + " ".join(sys.argv[1:]),
        "reproduce_command": reproduce_command(args, label, steps),
        "python_version": platform.python_version(), "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "greedy_fibonacci": greedy_continuation(model, tokenizer, "def fibonacci(n):"),
    }
    save_folder(model, tokenizer, folder, log)
    print(json.dumps({key: log[key] for key in ("model", "parameters", "train_seconds", "final_train_loss",
                                                "final_eval_loss", "size_on_disk_bytes")}), flush=True)
    print(f"def fibonacci(n):{log['greedy_fibonacci']}", flush=True)
    return log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("mini/assets"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-file-bytes", type=int, default=30_000, help="cut each stdlib file here")
    parser.add_argument("--eval-every", type=int, default=20, help="hold out every N-th document")
    parser.add_argument("--main-steps", type=int, default=2000)
    parser.add_argument("--draft-steps", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-time budget for the main model (overrides --main-steps)")
    parser.add_argument("--draft-minutes", type=float, default=None,
                        help="wall-time budget for the draft model (overrides --draft-steps)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--draft-only", action="store_true",
                        help="keep the main model; retrain the draft with its tokenizer")
    args = parser.parse_args(argv)
    for name in ("main_steps", "draft_steps", "batch_size", "context", "threads", "eval_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 300 <= args.vocab_size <= 65536:
        raise ValueError(f"--vocab-size must be in [300, 65536], got {args.vocab_size}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    documents = gather_corpus(args.max_file_bytes)
    train_docs, eval_docs = split_documents(documents, args.eval_every)
    main_dir, draft_dir = args.out_dir / "tiny-llama", args.out_dir / "tiny-llama-draft"
    if args.draft_only:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(main_dir)
    else:
        tokenizer = train_tokenizer(train_docs, args.vocab_size)
    streams = {"train": encode_documents(tokenizer, train_docs), "eval": encode_documents(tokenizer, eval_docs)}
    corpus_info = {
        "corpus": f"Python {platform.python_version()} stdlib *.py, each cut to {args.max_file_bytes} bytes",
        "corpus_bytes": sum(len(doc.encode()) for doc in documents), "corpus_documents": len(documents),
        "train_tokens": len(streams["train"]), "eval_tokens": len(streams["eval"]),
    }
    print(json.dumps(corpus_info), flush=True)
    if not args.draft_only:
        train_and_save(MAIN_SHAPE, args.main_steps, args.minutes, main_dir, "tiny-llama",
                       tokenizer, streams, corpus_info, args)
    train_and_save(DRAFT_SHAPE, args.draft_steps, args.draft_minutes, draft_dir, "tiny-llama-draft",
                   tokenizer, streams, corpus_info, args)


if __name__ == "__main__":
    main()
