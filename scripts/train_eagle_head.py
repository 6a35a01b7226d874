"""Train the EAGLE draft head (mini/spec_decode/eagle_head.py) for the shipped tiny Llama.

No vLLM counterpart (vLLM serves EAGLE heads trained elsewhere); the recipe is EAGLE's, written anew:

1. gather the same corpus and train/held-out split as ``scripts/train_shipped_model.py`` (its functions,
   imported) and tokenize it with the shipped tokenizer;
2. run the FROZEN target (transformers' ``LlamaForCausalLM`` on ``mini/assets/tiny-llama``) once over
   ``--num-sequences`` random non-overlapping chunks of ``--context`` tokens and keep its final hidden states
   ``h_t`` (``model.model(...).last_hidden_state``: after the final RMSNorm, what the LM head reads; in
   transformers 5.24 this equals ``hidden_states[-1]`` of ``output_hidden_states=True``);
3. train the head teacher-forced: at each position t the head reads ``(h_t, x_{t+1})`` and predicts
   ``ĥ_{t+1}``; loss = CE(lm_head(ĥ_{t+1}), target) + w * smooth-L1(ĥ_{t+1}, h_{t+1}) with
   w = ``--hidden-loss-weight`` = 1. The CE target is, by default (``--ce-target target``), the target model's
   own next-token distribution softmax(lm_head(h_{t+1})), as EAGLE's code does (the head should agree with the
   target, not with the text; this soft CE includes the target's own entropy, so it stays well above 0);
   ``--ce-target text`` uses the text token x_{t+2} instead. EAGLE's uniform input noise on h_t
   (``--input-noise``) is off by default. Short trial runs (120 steps) picked these: soft targets beat text
   targets (top-1 0.36 vs 0.33), w = 0.1 / 1 / 10 were within noise, noise 0.2 gave no gain. The training
   forward is the head's ``forward_contiguous`` (causal SDPA over the same weights as the paged path);
4. measure on held-out text: (a) teacher-forced top-1 agreement of the first draft with the target's argmax,
   and (b) greedy speculative decoding: on the target's own greedy continuations of held-out prompts, draft
   k = 1..4 tokens chained from the head's own predictions and count how many the target's greedy argmax
   accepts per step;
5. write ``mini/assets/tiny-llama-eagle/``: config.json, model.safetensors, training_log.json.

Run: ``python -m scripts.train_eagle_head`` (a few minutes on 2 idle CPU cores; the shipped head was made
with ``--threads 1`` on 2 cores shared with other jobs, see its training_log.json for the time it took).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from mini.spec_decode.eagle_head import EAGLE_ARCHITECTURE, EagleHead
from scripts.train_shipped_model import encode_documents, gather_corpus, lr_at, split_documents

# The target config fields the head's config.json carries (the rest of the head is fixed by the code).
HEAD_CONFIG_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
                      "attention_bias", "mlp_bias", "hidden_act", "max_position_embeddings", "eos_token_id")


def head_config(target_dir: Path) -> dict:
    target_config = json.loads((target_dir / "config.json").read_text())
    config = {field: target_config[field] for field in HEAD_CONFIG_FIELDS if field in target_config}
    config.update(architectures=[EAGLE_ARCHITECTURE], num_hidden_layers=1, target_model=target_dir.name,
                  fc_input_order=["embed(x_{t+1})", "h_t"], dtype="float32")
    return config


def random_chunks(stream: torch.Tensor, num_chunks: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """`num_chunks` distinct non-overlapping windows of `length` tokens, picked at random: `[N, length]`."""
    available = len(stream) // length
    if num_chunks > available:
        raise ValueError(f"--num-sequences must be <= {available} for this corpus and context, got {num_chunks}")
    picks = torch.randperm(available, generator=generator)[:num_chunks]
    return stream[: available * length].view(available, length)[picks.sort().values]


@torch.no_grad()
def target_hidden_states(target: LlamaForCausalLM, tokens: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """The target's final (post-norm) hidden states for `tokens` `[N, S]` -> `[N, S, H]`."""
    return torch.cat([target.model(tokens[i: i + batch_size]).last_hidden_state
                      for i in range(0, len(tokens), batch_size)])


def head_loss(head: EagleHead, lm_weight: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
              args: argparse.Namespace, generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """Teacher-forced loss on chunks: tokens `[B, S+1]` (x_0..x_S), hidden `[B, S, H]` (h_0..h_{S-1}).

    Position t = 0..S-2 reads (h_t, x_{t+1}) and predicts ĥ_{t+1}; returns (total, ce, smooth-L1, top-1
    agreement of lm_head(ĥ_{t+1}) with the target's argmax lm_head(h_{t+1})).
    """
    seq_len = hidden.shape[1]
    inputs = hidden[:, : seq_len - 1]
    if generator is not None and args.input_noise > 0:
        noise = torch.rand(inputs.shape, generator=generator) * 2 - 1
        inputs = inputs + args.input_noise * noise
    predicted = head.forward_contiguous(tokens[:, 1:seq_len], inputs)
    next_hidden = hidden[:, 1:seq_len]
    logits = torch.nn.functional.linear(predicted, lm_weight).flatten(0, 1)
    target_logits = torch.nn.functional.linear(next_hidden, lm_weight).flatten(0, 1)
    if args.ce_target == "text":
        ce = torch.nn.functional.cross_entropy(logits, tokens[:, 2: seq_len + 1].reshape(-1))
    else:
        ce = torch.nn.functional.cross_entropy(logits, target_logits.softmax(-1))
    regression = torch.nn.functional.smooth_l1_loss(predicted, next_hidden)
    agreement = (logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    return ce + args.hidden_loss_weight * regression, ce, regression, agreement


def train_head(head: EagleHead, lm_weight: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
               args: argparse.Namespace) -> dict:
    generator = torch.Generator().manual_seed(args.seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    head.train()
    started, recent = time.perf_counter(), []
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup_steps=min(50, args.steps // 10 + 1))
        rows = torch.randint(0, len(tokens), (args.batch_size,), generator=generator)
        loss, ce, regression, agreement = head_loss(head, lm_weight, tokens[rows], hidden[rows], args, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        recent = (recent + [(loss.item(), ce.item(), regression.item(), agreement.item())])[-20:]
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3f} ce {ce.item():.3f} "
                  f"smooth_l1 {regression.item():.4f} top1 {agreement.item():.3f} "
                  f"{time.perf_counter() - started:.0f}s", flush=True)
    head.eval()
    means = [sum(values) / len(values) for values in zip(*recent, strict=False)]
    return {"train_seconds": round(time.perf_counter() - started, 1),
            **{f"final_train_{name}": round(value, 4)
               for name, value in zip(("loss", "ce", "smooth_l1", "top1_agreement"), means, strict=False)}}


@torch.no_grad()
def evaluate_teacher_forced(head: EagleHead, lm_weight: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
                            args: argparse.Namespace) -> dict:
    """Held-out losses and the first draft's top-1 agreement with the target's argmax (real text context)."""
    totals = [0.0, 0.0, 0.0, 0.0]
    for start in range(0, len(tokens), 16):
        batch = head_loss(head, lm_weight, tokens[start: start + 16], hidden[start: start + 16], args)
        for index, value in enumerate(batch):
            totals[index] += value.item() * len(tokens[start: start + 16])
    names = ("loss", "ce", "smooth_l1", "first_draft_top1_agreement")
    return {f"held_out_{name}": round(total / len(tokens), 4) for name, total in zip(names, totals, strict=False)}


@torch.no_grad()
def draft_chain(head: EagleHead, lm_weight: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
                start: int, num_drafts: int) -> torch.Tensor:
    """Greedy drafts after position `start`, chained from the head's own predictions: `[B, num_drafts]`.

    The head reads (h_t, x_{t+1}) for t <= start (the target's states), then (ĥ, draft) pairs, as in
    vLLM's EagleProposer. Recomputes the whole prefix per draft (contiguous path; slow but simple).
    """
    ids, states, drafts = tokens[:, 1: start + 2], hidden[:, : start + 1], []
    for _ in range(num_drafts):
        predicted = head.forward_contiguous(ids, states)[:, -1]
        draft = torch.nn.functional.linear(predicted, lm_weight).argmax(-1)
        drafts.append(draft)
        ids = torch.cat((ids, draft[:, None]), dim=1)
        states = torch.cat((states, predicted[:, None]), dim=1)
    return torch.stack(drafts, dim=1)


@torch.no_grad()
def evaluate_acceptance(head: EagleHead, target: LlamaForCausalLM, prompts: torch.Tensor,
                        args: argparse.Namespace) -> dict:
    """Greedy speculative decoding on the target's own greedy continuations of held-out prompts.

    On such a trajectory the target's greedy choice after position t IS token t+1, so a draft chain started
    at t (after the target produced x_{t+1}) has its j-th draft accepted iff it equals x_{t+1+j} and all
    earlier drafts were accepted. Returns, for k = 1..max_k, the mean number of accepted drafts per step.
    """
    target.generation_config.eos_token_id = None  # follow the pure greedy path, end-of-text included
    sequences = target.generate(prompts, max_new_tokens=args.eval_new_tokens, do_sample=False,
                                pad_token_id=0)
    hidden = target_hidden_states(target, sequences)
    lm_weight = target.lm_head.weight
    greedy = torch.nn.functional.linear(hidden, lm_weight).argmax(-1)
    prompt_len = prompts.shape[1]
    on_greedy_path = (greedy[:, prompt_len - 1:-1] == sequences[:, prompt_len:]).float().mean().item()
    starts = range(prompt_len - 1, sequences.shape[1] - args.max_k - 1, args.eval_stride)
    accepted_runs = []
    for start in starts:
        drafts = draft_chain(head, lm_weight, sequences, hidden, start, args.max_k)
        matches = drafts == sequences[:, start + 2: start + 2 + args.max_k]
        accepted_runs.append(matches.long().cumprod(dim=1).sum(dim=1))
    accepted = torch.cat(accepted_runs)  # [num_steps]: leading matches among max_k drafts
    per_k = {str(k): round(accepted.clamp(max=k).float().mean().item(), 3) for k in range(1, args.max_k + 1)}
    return {
        "acceptance_setup": (f"{len(prompts)} held-out prompts of {prompt_len} tokens, target greedy for "
                             f"{args.eval_new_tokens} tokens, a draft chain every {args.eval_stride} positions"),
        "acceptance_steps_measured": len(accepted),
        "target_greedy_path_consistency": round(on_greedy_path, 4),
        "mean_accepted_drafts_per_step": per_k,
        "mean_tokens_per_target_step": {k: round(v + 1, 3) for k, v in per_k.items()},
        "first_draft_acceptance_rate_greedy": per_k["1"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=Path("mini/assets/tiny-llama"))
    parser.add_argument("--out-dir", type=Path, default=Path("mini/assets/tiny-llama-eagle"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads; on cores busy with other jobs 1 was measured ~2x faster than 2")
    parser.add_argument("--max-file-bytes", type=int, default=30_000, help="as train_shipped_model")
    parser.add_argument("--eval-every", type=int, default=20, help="as train_shipped_model: held-out docs")
    parser.add_argument("--num-sequences", type=int, default=1200, help="training chunks (target run once)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--hidden-loss-weight", type=float, default=1.0, help="w of the smooth-L1 term")
    parser.add_argument("--ce-target", choices=("target", "text"), default="target")
    parser.add_argument("--input-noise", type=float, default=0.0, help="uniform noise amplitude on h_t")
    parser.add_argument("--eval-sequences", type=int, default=48, help="held-out chunks for the losses")
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--eval-prompt-len", type=int, default=96)
    parser.add_argument("--eval-new-tokens", type=int, default=64)
    parser.add_argument("--eval-stride", type=int, default=4)
    parser.add_argument("--max-k", type=int, default=4)
    args = parser.parse_args(argv)
    for name in ("threads", "num_sequences", "context", "steps", "batch_size", "eval_sequences", "eval_prompts",
                 "eval_prompt_len", "eval_new_tokens", "eval_stride", "max_k"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train_docs, eval_docs = split_documents(gather_corpus(args.max_file_bytes), args.eval_every)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.target)
    train_stream, eval_stream = encode_documents(tokenizer, train_docs), encode_documents(tokenizer, eval_docs)
    target = LlamaForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval().requires_grad_(False)
    lm_weight = target.lm_head.weight

    train_tokens = random_chunks(train_stream, args.num_sequences, args.context + 1, generator)
    train_hidden = target_hidden_states(target, train_tokens[:, :-1])
    eval_chunks = random_chunks(eval_stream, args.eval_sequences + args.eval_prompts, args.context + 1, generator)
    eval_tokens, prompt_chunks = eval_chunks[: args.eval_sequences], eval_chunks[args.eval_sequences:]
    eval_hidden = target_hidden_states(target, eval_tokens[:, :-1])
    hidden_seconds = time.perf_counter() - started
    print(f"target hidden states for {args.num_sequences} x {args.context} tokens: {hidden_seconds:.0f}s", flush=True)

    config = head_config(args.target)
    head = EagleHead(config, target.model.embed_tokens)
    training = train_head(head, lm_weight, train_tokens, train_hidden, args)
    held_out = evaluate_teacher_forced(head, lm_weight, eval_tokens, eval_hidden, args)
    acceptance = evaluate_acceptance(head, target, prompt_chunks[:, : args.eval_prompt_len], args)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({name: tensor.contiguous() for name, tensor in head.state_dict().items()},
              str(args.out_dir / "model.safetensors"), metadata={"format": "pt"})
    (args.out_dir / "model.safetensors").chmod(0o644)  # save_file creates it owner-only
    log = {
        "model": "tiny-llama-eagle", "target_model": str(args.target),
        "parameters": sum(parameter.numel() for parameter in head.parameters()),
        "command": "python -m scripts.train_eagle_head " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "loss": (f"CE(lm_head(h_pred), {args.ce_target}) + {args.hidden_loss_weight} * smooth_l1(h_pred, h_next)"),
        "training_tokens": args.num_sequences * args.context, "target_hidden_seconds": round(hidden_seconds, 1),
        **training, **held_out, **acceptance,
        "total_seconds": round(time.perf_counter() - started, 1), "torch_threads": torch.get_num_threads(),
        "python_version": platform.python_version(), "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    (args.out_dir / "training_log.json").write_text(json.dumps(log, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({key: log[key] for key in ("total_seconds", "final_train_loss", "held_out_ce",
                                                 "held_out_first_draft_top1_agreement",
                                                 "mean_accepted_drafts_per_step")}), flush=True)


if __name__ == "__main__":
    main()
