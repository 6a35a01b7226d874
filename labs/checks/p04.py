"""Checks for phase 04 (the model runner), against mini's reference and Hugging Face transformers.

    check_rms_norm(rms_norm)                        # vs transformers' LlamaRMSNorm
    check_apply_rotary(apply_rotary)                # vs transformers' apply_rotary_pos_emb
    check_build_attention_metadata(build_attention_metadata)
    check_run_model(run_model)                      # several engine steps vs transformers' logits

The model checks build a tiny random Llama (2 layers, 4 query heads over 2 KV heads) from a config, in
memory, and copy the same weights into mini's model: nothing is downloaded.

Besides the values: rms_norm gets inputs where eps matters and large bfloat16 cases compared bit for bit
(the cast back before the weight); apply_rotary must leave its input untouched; build_attention_metadata
must return plain ints; run_model may give the LM head only the logits rows; update_states runs a workload
where a drafting request fills the token budget, so a running request is left out of a step and then comes
back in the same step as a new one. A failure names what went wrong where it can tell: rms_norm and
apply_rotary compare a wrong output with the usual misreadings (eps outside the root, LayerNorm, a (1 + weight)
gain, statistics in bfloat16; no minus sign, GPT-J pairs, cos and sin swapped) and say which one it matches;
run_model notices (logits, hidden) returned in the wrong order; update_states names the invariant the first
differing field breaks. vLLM v0.33.0's `rms_norm` (vllm/ir/ops/layernorm.py) and
`ApplyRotaryEmb.forward_static` (vllm/model_executor/layers/rotary_embedding/common.py) pass these checks
(tests/course/vllm_answers/test_p04.py); the other exercises mirror inline code or methods of
`GPUModelRunner` that need a GPU runner, and run nowhere here.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from labs.checks.common import (
    WORKED_EXAMPLE,
    calling,
    expect_equal,
    expect_same,
    passed,
    step_cases,
    tiny_llama_config,
)
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.worker import model_runner as runner
from mini.worker import prepare_inputs as prep


def _steps(seeds: Iterable[int]) -> list[dict[str, Any]]:
    """Phase 02's worked example (prefill, then decode) and random steps, token ids < 100 (the tiny vocab)."""
    return step_cases(seeds, max_token_id=100)


def _close(atol: float, rtol: float = 1e-4) -> Callable[[Any, Any], bool]:
    def equal(expected: torch.Tensor, got: Any) -> bool:
        return (
            isinstance(got, torch.Tensor)
            and got.shape == expected.shape
            and torch.allclose(got.float(), expected.float(), atol=atol, rtol=rtol)
        )

    return equal


def _expect_close_rows(
    what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str, atol: float = 1e-4
) -> None:
    """Shape first, then the list of rows (first dim) that differ: short counterexamples for big tensors."""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
            f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}"
        )
    expect_equal(f"{what}: shape", inputs, list(expected.shape), list(got.shape), hint)
    error = (got.float() - expected.float()).abs().flatten(1).amax(dim=1)
    wrong = (error > atol + 1e-4 * expected.float().abs().flatten(1).amax(dim=1)).nonzero().flatten().tolist()
    expect_equal(f"{what}: rows that differ", inputs, [], wrong, hint)


def _expect_tensor(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
            f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}"
        )
    expect_equal(what, inputs, expected.tolist(), got.tolist(), hint)
    expect_equal(f"{what} dtype", inputs, expected.dtype, got.dtype, "the values are right; check the dtype")


# ------------------------------------------------------------------------------------------ rms_norm
def _rms_norm_cases(seeds: Iterable[int]) -> list[tuple[tuple[int, ...], torch.dtype, float, float]]:
    """(shape, dtype, eps, scale of x): fixed cases first. Small x (scale 1e-3, mean(x**2) ~ 1e-6) and a
    large eps make eps matter; the big bfloat16 cases tell a cast-back-then-weight from a weight-then-cast."""
    cases = [((6, 64), torch.float32, 1e-6, 3.0), ((6, 4, 16), torch.float32, 1e-5, 3.0),
             ((3, 32), torch.bfloat16, 1e-6, 3.0),
             ((5, 64), torch.float32, 1e-5, 1e-3), ((4, 2, 16), torch.float32, 1e-2, 0.1),
             ((64, 256), torch.bfloat16, 1e-5, 3.0), ((32, 4, 64), torch.bfloat16, 1e-6, 1.0)]
    for number, seed in enumerate(seeds):
        rng = random.Random(seed)
        shape = (
            (rng.randint(1, 9), rng.choice([8, 32, 64]))
            if seed % 2
            else (rng.randint(1, 9), rng.choice([1, 2, 4]), rng.choice([8, 16]))
        )
        cases.append((shape, torch.bfloat16 if seed % 5 == 4 else torch.float32, [1e-6, 1e-5][number % 2],
                      rng.choice([3.0, 3.0, 1e-3])))
    return cases


def _rms_norm_misreadings(x: torch.Tensor, weight: torch.Tensor, eps: float) -> list[tuple[str, torch.Tensor]]:
    """(what a plausible misreading does, what it returns) for one rms_norm input, each in x's dtype."""
    dtype, xf = x.dtype, x.float()
    square_mean = xf.pow(2).mean(-1, keepdim=True)
    variants = [
        ("eps is missing (tiny inputs, where mean(x**2) is close to eps, show it)", xf * torch.rsqrt(square_mean)),
        ("eps is added outside the square root, not to mean(x**2) under it",
         xf / (square_mean.sqrt() + eps)),
        ("the mean is taken over the whole tensor, not over the last dim of each vector",
         xf * torch.rsqrt(xf.pow(2).mean() + eps)),
        (("the mean is taken over another dim than the last: each vector along the LAST dim is normalized on "
         "its own, whatever x's rank"), xf * torch.rsqrt(xf.pow(2).mean(0, keepdim=True) + eps)),
        ("the mean is subtracted first (that is LayerNorm; RMSNorm only rescales)",
         (xf - xf.mean(-1, keepdim=True)) * torch.rsqrt(xf.var(-1, keepdim=True, unbiased=False) + eps)),
    ]
    out = [(text, (value.to(dtype) * weight).to(dtype)) for text, value in variants]
    normalized = (xf * torch.rsqrt(square_mean + eps)).to(dtype)
    out.append(("the gain `weight` is never applied: after normalizing, multiply by it (one value per channel)",
                normalized))
    out.append(("the gain is applied as (1 + weight), as Gemma does (GemmaRMSNorm in vLLM); Llama multiplies by weight",
                (normalized * (1 + weight)).to(dtype)))
    if dtype != torch.float32:
        in_dtype = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        out.append((("the statistics are computed in the input dtype: upcast x to float32 for mean(x**2) and the "
                    "rescale (a sum of many bfloat16 squares keeps only 8 bits)"), (in_dtype * weight).to(dtype)))
    return out


def _rms_norm_hint(x: torch.Tensor, weight: torch.Tensor, eps: float, got: torch.Tensor) -> str:
    tolerance = 1e-5 if x.dtype == torch.float32 else 2e-2
    for text, value in _rms_norm_misreadings(x, weight, eps):
        if torch.allclose(got.float(), value.float(), atol=tolerance, rtol=1e-2 if tolerance > 1e-5 else 1e-4):
            return f"your output matches this misreading: {text}"
    return ("each vector along the LAST dim is rescaled to unit root-mean-square (eps added to the mean of the "
            "squares, under the root), in float32, then cast back and multiplied by weight")


def _bits_hint(x: torch.Tensor, weight: torch.Tensor, eps: float, got: torch.Tensor) -> str:
    """Which bfloat16 path `got` follows bit for bit (most of its elements): the order, or the statistics."""
    xf = x.float()
    normalized = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    in_dtype = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    paths = [
        (("the statistics are computed in the input dtype: upcast x to float32 for mean(x**2) and the rescale "
         "(a sum of many bfloat16 squares keeps only 8 bits), then round once"), (in_dtype * weight).to(x.dtype)),
        (("the weight is applied before the cast back: round the float32 result to x's dtype FIRST, then multiply "
         "by the weight (a product in that dtype, rounded again), as transformers and vLLM do"),
         (normalized * weight.float()).to(x.dtype)),
    ]
    for text, value in paths:
        if float((got == value).float().mean()) > 0.95:
            return f"your bits follow this path: {text}"
    return ("the float32 result is rounded to x's dtype FIRST, then multiplied by the weight (a product in that "
            "dtype, rounded again); the statistics are float32")


def _bf16_bits_differ(expected: torch.Tensor, got: Any) -> float:
    """The fraction of bfloat16 outputs that are not bit-identical to transformers'."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
        return 1.0
    return float((got != expected).float().mean())


@graded
def check_rms_norm(rms_norm: Callable, seeds: Iterable[int] = range(20)) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    cases = _rms_norm_cases(seeds)
    for number, (shape, dtype, eps, scale) in enumerate(cases):
        generator = torch.Generator().manual_seed(number)
        hf_norm = LlamaRMSNorm(shape[-1], eps=eps).to(dtype)
        with torch.no_grad():
            hf_norm.weight.copy_(1 + 0.5 * torch.randn(shape[-1], generator=generator))
        x = (scale * torch.randn(shape, generator=generator)).to(dtype)
        with torch.no_grad():
            expected = hf_norm(x)
        weight = hf_norm.weight.detach().clone()
        inputs = {"x.shape": list(shape), "x.dtype": str(dtype), "weight.dtype": str(weight.dtype), "eps": eps,
                  "mean(x**2)": float(x.float().pow(2).mean())}
        with calling("rms_norm", inputs, expected=f"a tensor {list(expected.shape)} {expected.dtype}"):
            got = rms_norm(x.clone(), weight, eps)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
                f"rms_norm: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}")
        expect_equal("rms_norm output shape", inputs, list(expected.shape), list(got.shape),
                     "normalize each vector along the last dim: the output has x's shape")
        close = _close(1e-5) if dtype == torch.float32 else _close(2e-2, rtol=1e-2)  # bf16: 1 ulp is ~0.4%
        if not close(expected, got):
            expect_same(
                "rms_norm (vs transformers' LlamaRMSNorm)",
                inputs,
                expected.float(),
                got.float(),
                _rms_norm_hint(x, weight, eps, got),
                axis_names=("token", "channel") if len(shape) == 2 else ("token", "head", "channel"),
                atol=1e-5 if dtype == torch.float32 else 2e-2,
                rtol=1e-4 if dtype == torch.float32 else 1e-2,
            )
        expect_equal(
            "rms_norm dtype",
            inputs,
            expected.dtype,
            got.dtype,
            "cast the normalized x back to its dtype BEFORE multiplying by weight (as transformers)",
        )
        if dtype == torch.bfloat16 and expected.numel() >= 4096:
            differ = _bf16_bits_differ(expected, got)
            expect_equal(
                "rms_norm in bfloat16: share of outputs not bit-identical to transformers'",
                inputs,
                "at most 1%",
                f"{100 * differ:.1f}%",
                _bits_hint(x, weight, eps, got),
                equal=lambda expected_text, got_text, differ=differ: differ <= 0.01,
            )
    passed("check_rms_norm", len(cases))


# -------------------------------------------------------------------------------------- apply_rotary
def _rotary_hint(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, got: torch.Tensor) -> str:
    """Names the misreading of "rotate half" RoPE that `got` matches, if any."""
    first, second = x.chunk(2, dim=-1)
    cos_, sin_ = cos[:, None, :], sin[:, None, :]
    even, odd = x[..., ::2], x[..., 1::2]
    half = x.shape[-1] // 2
    pair_cos, pair_sin = cos[:, None, :half], sin[:, None, :half]
    variants = [
        ("the rotated copy has no minus sign: (x1, x2) must turn into (-x2, x1), a rotation, not a swap",
         x * cos_ + torch.cat((second, first), dim=-1) * sin_),
        ("the minus sign is on the wrong half: the first half gets -x2 * sin, the second half + x1 * sin",
         x * cos_ + torch.cat((second, -first), dim=-1) * sin_),
        ("cos and sin are swapped: the unrotated x goes with cos (an angle of 0 must leave x unchanged)",
         x * sin_ + torch.cat((-second, first), dim=-1) * cos_),
        ("the pairs are neighbours (2k, 2k+1), GPT-J's layout; Llama pairs dimension k with k + head_dim/2",
         torch.stack((even * pair_cos - odd * pair_sin, odd * pair_cos + even * pair_sin), dim=-1).flatten(-2)),
        ("the pairs are neighbours (2k, 2k+1), GPT-J's layout; Llama pairs dimension k with k + head_dim/2",
         x * cos_ + torch.stack((-odd, even), dim=-1).flatten(-2) * sin_),
    ]
    for text, value in variants:
        if got.shape == value.shape and torch.allclose(got.float(), value.float(), atol=1e-5, rtol=1e-4):
            return f"your output matches this misreading: {text}"
    return ("each pair (dimension k, dimension k + head_dim/2) of every head turns by its token's angle "
            "(cos and sin of pair k sit in column k, repeated in column k + head_dim/2); the same rotation for "
            "every head of a token; broadcast cos/sin over the heads dim")


@graded
def check_apply_rotary(apply_rotary: Callable, seeds: Iterable[int] = range(20)) -> None:
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cases = [([6, 7, 8, 9, 5, 2], 4, 16, 10000.0)]  # phase 03's mixed batch: a chunk and two decodes
    for seed in seeds:
        rng = random.Random(seed)
        positions = [rng.randrange(200) for _ in range(rng.randint(1, 12))]
        cases.append((positions, rng.choice([1, 2, 4]), rng.choice([4, 8, 16, 32]), rng.choice([1e4, 5e5])))
    for number, (positions, heads, head_dim, theta) in enumerate(cases):
        config = transformers.LlamaConfig(
            hidden_size=heads * head_dim,
            num_attention_heads=heads,
            max_position_embeddings=256,
            rope_theta=theta,
        )
        rotary = LlamaRotaryEmbedding(config)
        x = torch.randn(len(positions), heads, head_dim, generator=torch.Generator().manual_seed(number))
        cos, sin = rotary(x, torch.tensor([positions]))
        cos, sin = cos[0], sin[0]  # [T, head_dim]: one row per flat token, from its own position
        hf_x = x.transpose(0, 1)[None]  # transformers wants [batch, heads, seq, head_dim]
        expected, _ = apply_rotary_pos_emb(hf_x, hf_x, cos[None], sin[None])
        expected = expected[0].transpose(0, 1)
        inputs = {"positions": positions, "x.shape": list(x.shape), "rope_theta": theta}
        given = x.clone()
        with calling("apply_rotary", inputs, expected=f"a tensor {list(expected.shape)}"):
            got = apply_rotary(given, cos.clone(), sin.clone())
        expect_equal(
            "apply_rotary: its input x after the call",
            inputs,
            "x unchanged",
            "x unchanged" if torch.equal(given, x) else "x modified in place",
            "return a NEW tensor: the model still needs q and k as they were (in-place ops such as "
            "mul_ or add_ on x, or writing into x's halves, change the caller's tensor)",
        )
        if not isinstance(got, torch.Tensor):
            raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
                f"apply_rotary: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}")
        expect_equal("apply_rotary output shape", inputs, list(expected.shape), list(got.shape),
                     "x's shape [T, heads, head_dim]: cos and sin [T, head_dim] broadcast over the heads dim "
                     "(one row per token), not over the tokens")
        if not _close(1e-5)(expected, got):
            expect_same(
                "apply_rotary (vs transformers' apply_rotary_pos_emb)",
                inputs,
                expected,
                got.float(),
                _rotary_hint(x, cos, sin, got),
                axis_names=("token", "head", "dim"),
                atol=1e-5,
                rtol=1e-4,
            )
    passed("check_apply_rotary", len(cases))


# -------------------------------------------------------------------------- build_attention_metadata
_METADATA_HINTS = {
    "num_actual_tokens": "the number of flat rows of this step (new tokens of all requests), not of requests "
                         "and not of cached tokens: a decode step of 3 requests has 3",
    "max_query_len": "the most NEW tokens any one request computes this step (1 in a decode-only step): the "
                     "largest gap between consecutive entries of query_start_loc, not its last entry",
    "max_seq_len": "the longest context of any request after this step (the largest seq_lens entry), whichever "
                   "request holds it",
}


@graded
def check_build_attention_metadata(
    build_attention_metadata: Callable, seeds: Iterable[int] = range(20)
) -> None:
    cases = _steps(seeds)
    for case in cases:
        step_inputs = prep.prepare_inputs(
            case["token_ids"],
            case["num_computed_tokens"],
            case["num_scheduled_tokens"],
            case["block_ids"],
            case["block_size"],
        )
        expected = runner.build_attention_metadata(step_inputs)
        inputs = {
            "num_computed_tokens": case["num_computed_tokens"],
            "num_scheduled_tokens": case["num_scheduled_tokens"],
            "query_start_loc": step_inputs.query_start_loc.tolist(),
            "seq_lens": step_inputs.seq_lens.tolist(),
        }
        with calling("build_attention_metadata", inputs):
            got = build_attention_metadata(step_inputs)
        for name in ("num_actual_tokens", "max_query_len", "max_seq_len"):
            value = getattr(got, name, None)
            expect_equal(
                f"build_attention_metadata(...).{name} type",
                inputs,
                "int",
                type(value).__name__,
                "a plain Python int (int(...) of a 0-d tensor): kernels take it as a launch size and "
                "the runner compares it without syncing with the device",
                equal=lambda expected_type, got_type, value=value: (isinstance(value, int)
                                                                    and not isinstance(value, bool)),
            )
            expect_equal(
                f"build_attention_metadata(...).{name}",
                inputs,
                getattr(expected, name),
                getattr(got, name, None),
                _METADATA_HINTS[name],
            )
        for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
            _expect_tensor(
                f"build_attention_metadata(...).{name}",
                inputs,
                getattr(expected, name),
                getattr(got, name, None),
                f"pass inputs.{name} through unchanged",
            )
    passed("check_build_attention_metadata", len(cases))


# -------------------------------------------------------------------------------------------- run_model
@functools.lru_cache(maxsize=1)
def tiny_models() -> tuple[Any, Any]:
    """(transformers LlamaForCausalLM, mini LlamaForCausalLM) with the same random weights."""
    import transformers

    from mini.model.llama import LlamaForCausalLM
    from mini.model.loader import load_weights

    config = tiny_llama_config(vocab_size=101, hidden_size=64, initializer_range=0.15, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(config).eval()
    model = LlamaForCausalLM(config).eval()
    load_weights(model, iter(hf_model.state_dict().items()))
    return hf_model, model


def _scenario(rng: random.Random | None) -> dict[str, Any]:
    """Requests with fixed token lists, computed over several steps in chunks (1 token = a decode)."""
    if rng is None:  # phase 02's prompts: a prefill step, then decodes
        token_ids = [t + [20 + i, 30 + i, 40 + i] for i, t in enumerate(WORKED_EXAMPLE["token_ids"])]
        return {"token_ids": token_ids, "prompt_lens": [5, 7, 3], "chunk": [99, 99, 99], "block_size": 4}
    num_reqs = rng.randint(1, 4)
    prompt_lens = [rng.randint(1, 14) for _ in range(num_reqs)]
    token_ids = [[rng.randrange(101) for _ in range(n + rng.randint(1, 2))] for n in prompt_lens]
    return {
        "token_ids": token_ids,
        "prompt_lens": prompt_lens,
        "chunk": [rng.randint(2, 8) for _ in prompt_lens],
        "block_size": rng.choice([1, 2, 4, 8]),
    }


@contextlib.contextmanager
def _recording_lm_head(model: Any) -> Iterator[list[int]]:
    """Records how many rows each call of `model.compute_logits` gets (the LM head), for one `with` block."""
    rows: list[int] = []
    compute_logits = model.compute_logits

    def recording(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows.append(int(hidden.shape[0]))
        return compute_logits(hidden, *args, **kwargs)

    model.compute_logits = recording
    try:
        yield rows
    finally:
        del model.compute_logits


@graded
def check_run_model(run_model: Callable, seeds: Iterable[int] = range(3)) -> None:
    hf_model, model = tiny_models()
    scenarios = [_scenario(None), *(_scenario(random.Random(seed)) for seed in seeds)]
    num_steps = 0
    for scenario in scenarios:
        token_ids, block_size = scenario["token_ids"], scenario["block_size"]
        with torch.no_grad():
            hf_logits = [hf_model(torch.tensor([ids])).logits[0] for ids in token_ids]  # [len, vocab] each
        free = list(range(1, 1 + sum(-(-len(ids) // block_size) for ids in token_ids)))
        random.Random(len(free)).shuffle(free)
        block_ids = [[free.pop() for _ in range(-(-len(ids) // block_size))] for ids in token_ids]
        shape = model.kv_cache_shape(sum(map(len, block_ids)) + 1, block_size)  # + the null block 0
        caches = [torch.zeros(shape) for _ in range(model.config.num_hidden_layers)]
        expected_caches = [torch.zeros(shape) for _ in range(model.config.num_hidden_layers)]
        computed = [0] * len(token_ids)
        for step in range(1, 100):
            rows = [i for i, ids in enumerate(token_ids) if computed[i] < len(ids)]
            if not rows:
                break
            scheduled = [
                min(scenario["chunk"][i], scenario["prompt_lens"][i] - computed[i])
                if computed[i] < scenario["prompt_lens"][i]
                else 1
                for i in rows
            ]
            step_inputs = prep.prepare_inputs(
                [token_ids[i] for i in rows],
                [computed[i] for i in rows],
                scheduled,
                [block_ids[i] for i in rows],
                block_size,
            )
            metadata = runner.build_attention_metadata(step_inputs)
            with torch.no_grad():
                expected_hidden, _ = runner.run_model(model, expected_caches, step_inputs, metadata)
            inputs = {
                "step": step,
                "token_ids": [token_ids[i] for i in rows],
                "num_computed_tokens": [computed[i] for i in rows],
                "num_scheduled_tokens": scheduled,
                "block_size": block_size,
            }
            with calling("run_model", inputs), torch.no_grad(), _recording_lm_head(model) as lm_head_rows:
                got = run_model(model, caches, step_inputs, metadata)
            expect_equal(
                "run_model: rows given to model.compute_logits (the LM head)",
                inputs,
                [len(rows)],
                lm_head_rows,
                "only the rows at inputs.logits_indices go through the LM head: select "
                "hidden[inputs.logits_indices] first, then compute_logits (the saving of the deep dive)",
            )
            if not (isinstance(got, tuple) and len(got) == 2):
                raise AssertionError(
                    f"run_model must return (hidden, logits), got {type(got).__name__}\n  inputs: {inputs}"
                )
            hidden, logits = got
            if (isinstance(hidden, torch.Tensor) and isinstance(logits, torch.Tensor)
                    and hidden.shape[-1:] == hf_logits[0].shape[-1:] and logits.shape == expected_hidden.shape):
                raise AssertionError(
                    f"run_model returned (logits, hidden): its first item has {hidden.shape[-1]} columns (the "
                    f"vocab), its second {logits.shape[-1]} (hidden_size)\n  inputs: {inputs}\n  hint: return "
                    "(hidden, logits), in that order (execute_model unpacks them so)")
            _expect_close_rows(
                "run_model hidden states [T, hidden_size]",
                inputs,
                expected_hidden,
                hidden,
                "ALL hidden states, one per flat row (the drafters of phase 12 read them; only the logits are "
                "cut down), from model(input_ids, positions, kv_caches, metadata) over the whole flat batch: "
                "each token at its own position in its request (inputs.positions); a wrong row at a later step "
                "means the K/V of an earlier step never reached kv_caches",
            )
            last_positions = [computed[i] + n - 1 for i, n in zip(rows, scheduled, strict=False)]
            hf_rows = torch.stack([hf_logits[i][p] for i, p in zip(rows, last_positions, strict=False)])
            _expect_close_rows(
                "run_model logits [num_reqs, vocab] (vs transformers on the full sequences)",
                inputs,
                hf_rows,
                logits,
                "one row per request: model.compute_logits(hidden[inputs.logits_indices])",
            )
            for i, n in zip(rows, scheduled, strict=False):
                computed[i] += n
            num_steps += 1
    passed("check_run_model", num_steps)


# ------------------------------------------------------------------------------------- update_states
UPDATE_STATES_WORKLOAD = {  # 3 prompts in a pool too small for all of them: chunked prefill, preemption
    "prompts": [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]],
    "max_tokens": [6, 5, 7],
    "block_size": 4,
    "num_blocks": 7,
    "max_num_batched_tokens": 8,
    "late": {},
}


# r0 drafts 3 tokens a step (all rejected): with a budget of 4 tokens it alone fills steps 2 and 3, so the
# running r1 is NOT scheduled there (its row leaves the batch, its state stays); r0 stops on token 81 after
# step 3, and step 4 brings r2 in as a new request while r1 comes back as a cached one: new rows first.
UPDATE_STATES_STARVED = {
    "prompts": [[1, 2, 3], [5, 6, 8], [7]],
    "max_tokens": [20, 5, 3],
    "block_size": 2,
    "num_blocks": 24,
    "max_num_batched_tokens": 4,
    "late": {"r2": 1},
    "drafts": {"r0": 3},
    "stop": {"r0": [81]},
}


def _random_workload(rng: random.Random) -> dict[str, Any]:
    num_reqs = rng.randint(2, 5)
    prompts = [[rng.randrange(1, 400) for _ in range(rng.randint(2, 12))] for _ in range(num_reqs)]
    block_size = rng.choice([2, 4])
    need = max(-(-(len(p) + 8) // block_size) for p in prompts)
    return {
        "prompts": prompts,
        "max_tokens": [rng.randint(1, 8) for _ in prompts],
        "block_size": block_size,
        "num_blocks": need + 1 + rng.randint(0, 6),
        "max_num_batched_tokens": rng.choice([6, 8, 16, 64]),
        "late": {f"r{i}": rng.randint(1, 4) for i in range(num_reqs) if i and rng.random() < 0.3},
    }


def record_scheduler_outputs(workload: dict[str, Any]) -> tuple[Any, list[tuple[Any, dict[str, list[int]]]]]:
    """Drive mini's real scheduler on `workload` (no model: made-up sampled tokens).

    Returns (the EngineConfig, [(a copy of each step's SchedulerOutput, the tokens sampled per request)]).
    """
    import copy

    from mini.config import EngineConfig
    from mini.core.kv_cache_manager import KVCacheManager
    from mini.core.request import Request
    from mini.core.sched.scheduler import Scheduler
    from mini.runner_outputs import ModelRunnerOutput
    from mini.sampling_params import SamplingParams

    config = EngineConfig(
        block_size=workload["block_size"],
        num_gpu_blocks_override=workload["num_blocks"],
        max_num_batched_tokens=workload["max_num_batched_tokens"],
        max_model_len=64,
        max_num_seqs=8,
        scheduling_policy=workload.get("policy", "fcfs"),
    )
    scheduler = Scheduler(config, KVCacheManager(workload["num_blocks"], workload["block_size"]))
    pairs = zip(workload["prompts"], workload["max_tokens"], strict=False)
    pending = {f"r{i}": (p, n) for i, (p, n) in enumerate(pairs)}
    steps: list[tuple[Any, dict[str, list[int]]]] = []
    for step in range(200):
        for req_id in [r for r in pending if workload["late"].get(r, 0) <= step]:
            prompt, max_tokens = pending.pop(req_id)
            scheduler.add_request(
                Request(
                    req_id,
                    list(prompt),
                    SamplingParams(
                        temperature=0.0,
                        max_tokens=max_tokens,
                        ignore_eos=True,
                        seed=1 if req_id == "r1" else None,
                        stop_token_ids=workload.get("stop", {}).get(req_id),
                    ),
                    priority=workload.get("priorities", {}).get(req_id, 0),
                )
            )
        if not (pending or scheduler.has_unfinished_requests()):
            break
        output = scheduler.schedule()
        computed = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
        sampled = {}
        for req_id, count in output.num_scheduled_tokens.items():
            is_partial = computed[req_id] + count < scheduler.requests[req_id].num_tokens
            sampled[req_id] = [] if is_partial else [(7 * step + len(req_id) * 31 + count) % 400 + 1]
        steps.append((copy.deepcopy(output), sampled))
        req_ids = list(output.num_scheduled_tokens)
        drafts = workload.get("drafts", {})  # a drafter's proposals: the next step verifies them (all rejected)
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[sampled[r] for r in req_ids],
                spec_token_ids=[[(step + k) % 400 + 1 for k in range(drafts.get(r, 0))] for r in req_ids]
                if drafts else None,
            ),
        )
    return config, steps


@functools.lru_cache(maxsize=1)
def _small_model() -> Any:
    """A 1-layer mini Llama built from a plain config dict: the runner needs one, update_states never runs it."""
    from mini.model.llama import LlamaForCausalLM

    return LlamaForCausalLM(
        {
            "model_type": "llama",
            "vocab_size": 401,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
        }
    )


class _RecordingLogitsprocs:
    """Stands in for the runner's logits processors: records each BatchUpdate it is given."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    def update_state(self, batch_update: Any) -> None:
        self.updates.append(
            None
            if batch_update is None
            else (
                sorted(a[0] for a in batch_update.added),
                sorted(batch_update.removed),
                [(m[0], m[1]) for m in batch_update.moved],
            )
        )


def _runner_state(model_runner: Any) -> dict[str, Any]:
    """What update_states is graded on, read defensively: a learner may store something that is no
    CachedRequestState (or replace the logits processors), and the check must still say what differs."""
    missing = "<missing>"

    def state(s: Any) -> dict[str, Any]:
        if not hasattr(s, "req_id"):
            return {"is a CachedRequestState": f"no: a {type(s).__name__}"}
        return {
            "prompt_token_ids": getattr(s, "prompt_token_ids", missing),
            "output_token_ids": getattr(s, "output_token_ids", missing),
            "block_ids": getattr(s, "block_ids", missing),
            "num_computed_tokens": getattr(s, "num_computed_tokens", missing),
            "has_generator": getattr(s, "generator", None) is not None,
        }

    requests = getattr(model_runner, "requests", {})
    return {
        "rows (input_batch.req_ids)": list(model_runner.input_batch.req_ids),
        "requests": {str(req_id): state(s) for req_id, s in sorted(requests.items(), key=lambda kv: str(kv[0]))}
        if isinstance(requests, dict) else f"not a dict: a {type(requests).__name__}",
        "BatchUpdates given to logitsprocs.update_state": list(getattr(model_runner.logitsprocs, "updates",
                                                                       [missing])),
    }


def _describe(scheduler_output: Any) -> dict[str, Any]:
    cached = scheduler_output.scheduled_cached_reqs
    return {
        "finished_req_ids": sorted(scheduler_output.finished_req_ids),
        "scheduled_new_reqs": [
            (
                n.req_id,
                f"prompt {n.prompt_token_ids}",
                f"output {n.output_token_ids}",
                f"blocks {n.block_ids}",
                f"computed {n.num_computed_tokens}",
            )
            for n in scheduler_output.scheduled_new_reqs
        ],
        "scheduled_cached_reqs": list(zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens,
                                          strict=False)),
        "num_scheduled_tokens": dict(scheduler_output.num_scheduled_tokens),
    }


def _update_states_hint(key: str, expected: Any, got: Any, scheduler_output: Any) -> str:
    """The rule the first differing field of update_states exercises."""
    finished = set(scheduler_output.finished_req_ids)
    scheduled = set(scheduler_output.num_scheduled_tokens)
    if key.startswith("rows"):
        rows, want = [r for r in got if r is not None], [r for r in expected if r is not None]
        if set(rows) & finished:
            return "a finished (or preempted) request leaves its row and its state"
        if set(rows) - scheduled:
            return ("a running request the scheduler left out of this step leaves its row (and keeps its "
                    "state: it comes back later)")
        if None in got or len(got) != len(expected):
            return "after adding and removing, condense() so that rows 0..num_reqs-1 are dense"
        if set(rows) == set(want):
            return ("rows are added in order, each into the lowest free row: this step's new requests first, "
                    "then cached requests that had no row; condense() then moves the last rows into holes")
        return "every scheduled request has a row after update_states"
    if key == "requests":
        if not isinstance(got, dict):
            return "self.requests maps each request id to its CachedRequestState"
        for req_id in sorted(set(expected) | set(got)):
            if req_id not in got:
                return (f"{req_id}: a request that is running (even if not scheduled this step) keeps its "
                        f"CachedRequestState; only finished_req_ids drop it")
            if req_id not in expected:
                return f"{req_id}: finished_req_ids (finished, aborted or preempted) drop the request's state"
            if "is a CachedRequestState" in got[req_id]:
                return (f"{req_id}: self.requests holds a CachedRequestState per request, built from the "
                        "NewRequestData fields (not the NewRequestData itself)")
            for field_name in expected[req_id]:
                if expected[req_id][field_name] != got[req_id].get(field_name):
                    return {
                        "block_ids": f"{req_id}: a cached request's new_block_ids EXTEND its block_ids",
                        "num_computed_tokens": f"{req_id}: set num_computed_tokens from the scheduler output",
                    }.get(field_name, f"{req_id}.{field_name}: build the state from the NewRequestData fields "
                                      "(copy the lists; generator from self._make_generator)")
    return ("the BatchUpdate lists the rows added, removed and moved this step, as your calls made them: rows "
            "leave first, then add_request puts the queued states into the lowest holes, "
            "then condense() moves the last rows into the holes still empty; hand the step's "
            "self.input_batch.get_batch_update() to self.logitsprocs.update_state once, after condense()")


@graded
def check_update_states(update_states: Callable, seeds: Iterable[int] = range(3)) -> None:
    from mini.worker.model_runner import ModelRunner

    workloads = [UPDATE_STATES_WORKLOAD, UPDATE_STATES_STARVED,
                 *(_random_workload(random.Random(seed)) for seed in seeds)]
    num_steps = 0
    for workload in workloads:
        config, steps = record_scheduler_outputs(workload)
        runners = []
        for _ in range(2):
            model_runner = ModelRunner(config, _small_model(), None, workload["num_blocks"])
            model_runner.logitsprocs = _RecordingLogitsprocs()
            runners.append(model_runner)
        expected_runner, got_runner = runners
        history: list[str] = []
        for step, (scheduler_output, sampled) in enumerate(steps, start=1):
            inputs = {
                "step": step,
                "this step's SchedulerOutput": _describe(scheduler_output),
                "earlier steps (num_scheduled_tokens)": history[-4:],
            }
            expected_runner.update_states(scheduler_output)
            with calling("update_states", inputs):
                update_states(got_runner, scheduler_output)
            expected, got = _runner_state(expected_runner), _runner_state(got_runner)
            for key in expected:
                if expected[key] != got[key]:
                    expect_same(
                        f"update_states: {key}",
                        inputs,
                        expected[key],
                        got[key],
                        _update_states_hint(key, expected[key], got[key], scheduler_output),
                    )
            for model_runner in runners:  # what execute_model does after sampling: append the kept tokens
                for state in model_runner.input_batch.occupied_requests():
                    for token in sampled.get(state.req_id, []):
                        state.append_output_token(token)
            history.append(str(dict(scheduler_output.num_scheduled_tokens)))
            num_steps += 1
    passed("check_update_states", num_steps)


# Built once in the grading process before it forks a child per check (labs/checks/grading.py).
WARM_UP = (tiny_models, _small_model)


PHASE = Phase("04_model_runner", (
    Exercise("rms_norm", check_rms_norm, points=3, grade_id="test-rms-norm", part="rms_norm"),
    Exercise("apply_rotary", check_apply_rotary, points=2, grade_id="test-apply-rotary", part="apply_rotary"),
    Exercise("build_attention_metadata", check_build_attention_metadata, points=2, grade_id="test-attention-metadata",
             part="build_attention_metadata"),
    Exercise("run_model", check_run_model, points=2, grade_id="test-run-model", part="run_model"),
    Exercise("update_states", check_update_states, points=6, grade_id="test-update-states", part="update_states",
             design="the order of update_states' operations (drop, unschedule, take in, extend, add rows, condense, "
                    "notify), derived from its invariants and the worked steps"),
))
