"""The kernel-access view (labs/views/kernel_access.py): the PyTorch replay of the decode kernel computes
the reference attention and reads exactly each request's slots; the record of a real interpreter run
agrees with it; the figure, HTML and widget build; and phase 07's notebook degrades cleanly without
Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from patience import RUN_GUARD_S

from labs.checks.p07 import make_batch
from labs.course.release import REPO_ROOT
from labs.views import kernel_access
from labs.views.kernel_access import (
    kernel_access_widget,
    online_softmax_update,
    plot_kernel_access,
    record_paged_decode,
    render_kernel_access_html,
    replay_paged_decode,
)
from mini.attention import reference, triton_utils

CASES = [
    {"seq_lens": [5, 9, 20], "block_size": 4, "num_kv_heads": 2, "group_size": 2, "head_size": 16},
    {"seq_lens": [1, 16, 33], "block_size": 16, "num_kv_heads": 1, "group_size": 4, "head_size": 8,
     "num_padding_tokens": 2},
    {"seq_lens": [4, 8, 3], "block_size": 4, "num_kv_heads": 3, "group_size": 1, "head_size": 24, "seed": 3},
]

can_record = triton_utils.is_available() and not torch.cuda.is_available()


def _cpu_batch(case: dict) -> dict:
    batch = make_batch(**case)
    assert batch["kv_cache"].device.type == "cpu" or not can_record
    return batch


@pytest.mark.parametrize("case", CASES)
def test_replay_computes_the_reference_attention(case):
    batch = _cpu_batch(case)
    expected = reference.paged_attention(batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"])
    output, access = replay_paged_decode(batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"])
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    assert access.source == "replay"


@pytest.mark.parametrize("case", CASES)
def test_each_program_reads_exactly_its_request_through_the_block_table(case):
    batch = _cpu_batch(case)
    metadata = batch["metadata"]
    _, access = replay_paged_decode(batch["query"], batch["kv_cache"], metadata, batch["scale"], tile_n=8)
    num_requests, num_kv_heads = len(case["seq_lens"]), case["num_kv_heads"]
    assert [(p.request, p.kv_head) for p in access.programs] == [
        (r, h) for r in range(num_requests) for h in range(num_kv_heads)]
    block_size = case["block_size"]
    for program in access.programs:
        seq_len = case["seq_lens"][program.request]
        ids = batch["block_ids"][program.request]
        expected_slots = [ids[p // block_size] * block_size + p % block_size for p in range(seq_len)]
        assert program.slots(block_size) == expected_slots
        assert program.blocks() == ids
        assert len(program.tiles) == -(-seq_len // 8)
        assert all(len(t.positions) <= 8 for t in program.tiles)
        group = case["group_size"]
        assert program.query_heads == list(range(program.kv_head * group, (program.kv_head + 1) * group))
    assert access.steps() == [(i, t) for i, p in enumerate(access.programs) for t in range(len(p.tiles))]


@pytest.mark.skipif(not can_record, reason="recording needs Triton's interpreter (Triton on a CPU-only machine)")
@pytest.mark.parametrize("case", CASES)
def test_interpreter_recording_matches_the_replay(case):
    batch = _cpu_batch(case)
    args = (batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"])
    recorded_out, recorded = record_paged_decode(*args)
    replayed_out, replayed = replay_paged_decode(*args)
    assert recorded.source == "interpreter"
    assert recorded.same_reads(replayed)
    assert recorded.tile_n == replayed.tile_n == kernel_access.DECODE_TILE_N
    torch.testing.assert_close(recorded_out, replayed_out, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not can_record, reason="recording needs Triton's interpreter (Triton on a CPU-only machine)")
def test_recording_restores_the_interpreter_and_skips_non_decode_rows():
    from triton.runtime import interpreter

    batch = _cpu_batch(CASES[0])
    metadata = batch["metadata"]
    metadata.query_start_loc = torch.tensor([0, 1, 1, 2], dtype=torch.int32)  # request 1 has no new token
    _, access = record_paged_decode(batch["query"], batch["kv_cache"], metadata, batch["scale"])
    assert sorted({p.request for p in access.programs}) == [0, 2]
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)


def test_online_softmax_streams_to_the_softmax():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 37, generator=generator) * 20
    scores[1, :16] = float("-inf")  # a row that sees only masked scores in its first tile
    values = torch.randn(37, 5, generator=generator)
    state = (torch.full((3,), float("-inf")), torch.zeros(3), torch.zeros(3, 5))
    for start in range(0, 37, 16):
        state = online_softmax_update(*state, scores[:, start:start + 16], values[start:start + 16])
        assert not any(torch.isnan(t).any() for t in state)
    torch.testing.assert_close(state[2] / state[1][:, None], torch.softmax(scores, 1) @ values, atol=1e-5, rtol=1e-5)


def test_rendering_figure_html_and_widget():
    batch = _cpu_batch(CASES[0])
    _, access = replay_paged_decode(batch["query"], batch["kv_cache"], batch["metadata"], batch["scale"])
    ax = plot_kernel_access(access)
    assert len(ax.patches) == sum(len(p.slots(access.block_size)) for p in access.programs)
    matplotlib.pyplot.close("all")
    text = render_kernel_access_html(access, step=len(access.steps()) - 1)
    assert "program (request 2, KV head 1)" in text and "tile 1" in text
    assert text.count("3px solid") == 20 - 16  # the last step reads the 4 positions of request 2's 2nd tile
    box = kernel_access_widget(access)
    controls, board = box.children
    slider = controls.children[1]
    assert slider.max == len(access.steps()) - 1
    slider.value = 1
    assert "step 1:" in board.value
    assert box.access is access
    assert box.text().startswith("Text view of the kernel-access widget (step 1 of") and "step 1:" in box.text()
    assert "program (request 2, KV head 1)" in box.text(len(access.steps()) - 1)


def test_decode_arithmetic_for_llama_3_8b():
    per_token = kernel_access.decode_step_bytes([1], 32, 8, 128, 2)
    assert per_token == 128 * 1024
    assert kernel_access.decode_step_flops([1], 32, 32, 128) / per_token == 4
    assert kernel_access.arithmetic_intensity(32, 8, 2) == 4


def test_phase_07_without_triton_explains_and_keeps_the_pytorch_exercise(tmp_path):
    """On macOS/Windows (faked here): the setup cell prints the message, exercise 1 grades, kernels don't."""
    script = textwrap.dedent(f"""
        import json, platform
        platform.machine = lambda: "arm64"   # no Triton wheels here, as far as mini can tell
        import torch
        from labs.course.answers import load_answers
        from labs.checks import p07
        answers = load_answers({str(REPO_ROOT / "solutions/07_attention_kernel/07_attention_kernel.ipynb")!r})
        result = {{"setup_error": answers.setup_error, "available": p07.TRITON_AVAILABLE,
                   "errors": [c.error for c in answers.cells if c.error]}}
        p07.check_online_softmax_update(answers.get("online_softmax_update"), seeds=range(3))
        for check, name in [(p07.check_store_kv_kernel, "_store_kv_kernel"), (p07.check_paged_decode, "paged_decode")]:
            try:
                check(answers.get(name))
            except AssertionError as error:
                result[name] = str(error)
        try:
            answers.get("store_kv")(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(2, 2, 4, 1, 8),
                                    torch.tensor([5]))
        except Exception as error:
            result["launch"] = f"{{type(error).__name__}}: {{error}}"
        print("RESULT" + json.dumps(result))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=tmp_path, env=env, capture_output=True,
                          text=True,
                          timeout=RUN_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Linux x86_64" in done.stdout.split("RESULT")[0], "the setup cell prints the platform message"
    result = json.loads(done.stdout.split("RESULT")[1])
    assert result["setup_error"] is None and result["errors"] == [] and result["available"] is False
    for name in ("_store_kv_kernel", "paged_decode"):
        assert "Linux x86_64" in result[name] and "online-softmax exercise still works" in result[name]
    assert "needs Triton" in result["launch"] or "Linux x86_64" in result["launch"]
