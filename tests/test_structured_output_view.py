"""The FSM-mask view (labs/views/fsm_mask.py): walk, figure and widget on the shipped tokenizer."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from mini.config import SHIPPED_MODEL_DIR

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")


@pytest.fixture(scope="module")
def tokenizer():
    from mini.tokenizer import load_tokenizer

    return load_tokenizer(SHIPPED_MODEL_DIR)


def test_walk_follows_state_and_mask(tokenizer):
    from labs.views.fsm_mask import compile_grammar, fsm_walk

    compiled = compile_grammar(tokenizer, "regex", r"[a-c]{1,2}-\d", vocab_size=4096)
    steps = fsm_walk(compiled, tokenizer.encode("ab-7", add_special_tokens=False))
    assert steps[0].state == 0 and not steps[0].accepting
    assert steps[-1].accepting and steps[-1].allowed_token_ids == [tokenizer.eos_token_id]
    dash = tokenizer.convert_tokens_to_ids("-")
    assert steps[-3].allowed_token_ids == [dash]  # after "ab": only "-"
    for step in steps[:-1]:
        assert set(step.allowed_token_ids) == set(compiled.index.allowed_token_ids(step.state))
    refused = fsm_walk(compiled, tokenizer.encode("zz", add_special_tokens=False))
    assert refused[-1].state == -1 and refused[-1].allowed_token_ids == []


def test_figure_and_widget(tokenizer, capsys):
    import matplotlib.pyplot as plt

    from labs.views.fsm_mask import compile_grammar, fsm_mask_figure, fsm_mask_widget, fsm_walk

    compiled = compile_grammar(tokenizer, "choice", '["yes", "no"]', vocab_size=4096)
    step = fsm_walk(compiled, [])[0]
    figure = fsm_mask_figure(compiled, step)
    graph_ax, mask_ax = figure.axes
    assert "state 0" in graph_ax.get_title()
    assert mask_ax.get_title().startswith(f"mask: {len(step.allowed_token_ids)} of 4096")
    plt.close(figure)
    widget = fsm_mask_widget(compiled, tokenizer, seed=1)
    text, sample, reset = widget.children[0].children
    text.value = "ye"
    sample.click()  # one allowed token: "s"
    assert widget.fsm_tokens == [*tokenizer.encode("ye", add_special_tokens=False), tokenizer.convert_tokens_to_ids("s")]
    printed = capsys.readouterr().out  # outside a notebook the Output area passes prints through
    assert "allowed next (1): " + f"{tokenizer.convert_tokens_to_ids('s')}:'s'" in printed  # after "ye": only "s"
    assert f"allowed next (1): {tokenizer.eos_token_id}:" in printed  # after "yes": only EOS
    reset.click()
    assert text.value == "" and widget.fsm_tokens == []
