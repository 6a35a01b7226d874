"""The FSM-mask view (labs/views/fsm_mask.py): walk, figure and widget on the shipped tokenizer."""

from __future__ import annotations

import matplotlib
import pytest

from mini.config import SHIPPED_MODEL_DIR

matplotlib.use("Agg")  # this process only: an MPLBACKEND set here would reach every kernel the suite starts

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")
pytestmark = [pytestmark, pytest.mark.inprocess_engine]  # it looks inside the engine: in-process engines


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


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
          "required": ["name"]}


def test_multi_byte_token_path_groups_and_mask_word(tokenizer):
    import json

    from labs.views.fsm_mask import allowed_groups, byte_trail, compile_grammar, fsm_walk, mask_word

    compiled = compile_grammar(tokenizer, "json", json.dumps(SCHEMA), vocab_size=4096)
    ids = tokenizer.encode('{"name": "ab', add_special_tokens=False)
    step = fsm_walk(compiled, ids)[-1]
    data = compiled.index.trie_bytes(ids[-1])
    assert len(data) > 1 and len(step.path) == len(data) + 1         # one state per byte of the last token
    assert step.path[-1] == step.state and compiled.dfa.walk(data, step.path[0]) == step.state
    trail = byte_trail(compiled, ids)
    assert [t.state for t in trail][-len(data):] == step.path[1:] and trail[-1].token_index == len(ids) - 1
    groups = allowed_groups(compiled, step)
    assert sorted(t for g in groups for t in g.token_ids) == step.allowed_token_ids
    for group in groups[:3]:
        for token in group.token_ids[:20]:
            assert compiled.dfa.walk(compiled.index.trie_bytes(token), step.state) == group.next_state
    word = mask_word(compiled, step.state)
    allowed = set(step.allowed_token_ids)
    assert 0 < sum(word.bits) < 32                              # a word with bits set and clear
    assert [word.bits[j] for j in range(32)] == [int(32 * word.word + j in allowed) for j in range(32)]
    assert word.value == int(compiled.index.mask(step.state)[word.word])


def test_masked_distribution_renormalises_over_the_allowed_tokens():
    import numpy as np

    from labs.views.fsm_mask import masked_distribution

    logits = np.log(np.array([0.5, 0.2, 0.2, 0.1]))
    d = masked_distribution(logits, [1, 3], top=3)
    assert [t for t, _, _ in d.top_before] == [0, 1, 2] and [ok for _, _, ok in d.top_before] == [False, True, False]
    assert abs(d.allowed_mass - 0.3) < 1e-9
    assert [t for t, _ in d.top_after] == [1, 3] and np.allclose([p for _, p in d.top_after], [2 / 3, 1 / 3])


def test_figure_and_widget(tokenizer, capsys):
    import matplotlib.pyplot as plt
    import numpy as np

    from labs.views.fsm_mask import compile_grammar, fsm_mask_figure, fsm_mask_widget, fsm_walk

    compiled = compile_grammar(tokenizer, "choice", '["yes", "no"]', vocab_size=4096)
    step = fsm_walk(compiled, [])[0]
    figure = fsm_mask_figure(compiled, step)
    (graph_ax,) = figure.axes
    assert "current state 0" in graph_ax.get_title(loc="left")
    plt.close(figure)
    widget = fsm_mask_widget(compiled, tokenizer, seed=1)
    text, sample, reset = widget.children[0].children
    text.value = "ye"
    sample.click()  # one allowed token: "s"
    assert widget.fsm_tokens == [*tokenizer.encode("ye", add_special_tokens=False),
                                 tokenizer.convert_tokens_to_ids("s")]
    printed = capsys.readouterr().out  # outside a notebook the Output area passes prints through
    assert "allowed next (1): " + f"{tokenizer.convert_tokens_to_ids('s')}:'s'" in printed  # after "ye": only "s"
    assert f"allowed next (1): {tokenizer.eos_token_id}:" in printed  # after "yes": only EOS
    assert widget.text().startswith("Text view of the FSM-mask widget")
    assert "uniform over the allowed tokens: no model given" in widget.text()
    reset.click()
    assert text.value == "" and widget.fsm_tokens == []
    assert widget._repr_mimebundle_()["text/plain"] == widget.text()

    # with a model: the draw follows its masked distribution (here it puts almost all allowed mass on "n")
    no, yes = tokenizer.encode("n", add_special_tokens=False)[0], tokenizer.encode("y", add_special_tokens=False)[0]
    calls = []

    def next_logits(output_ids):
        calls.append(list(output_ids))
        logits = np.zeros(4096)
        logits[no], logits[yes] = 12.0, 1.0
        logits[5] = 30.0          # the model's favourite is not allowed: the mask removes it
        return logits

    widget = fsm_mask_widget(compiled, tokenizer, seed=0, next_logits=next_logits)
    widget.children[0].children[1].click()
    assert widget.fsm_tokens == [no]
    shown = widget.text()
    assert "before the mask" in shown and "(masked)" in shown and "drawn from the model's masked distribution" in shown
    assert calls.count([]) == 1   # one model call per prefix, shared by the redraw and the draw
    started = fsm_mask_widget(compiled, tokenizer, prefix="ye")
    assert started.fsm_tokens == tokenizer.encode("ye", add_special_tokens=False)
    assert started.children[0].children[0].value == "ye" and "tokens so far: [" in started.text()


def test_views_fall_back_to_text_without_ipywidgets(tokenizer, monkeypatch):
    import sys

    from labs.views.fsm_mask import compile_grammar, fsm_mask_widget

    monkeypatch.setitem(sys.modules, "ipywidgets", None)   # `import ipywidgets` raises ImportError
    compiled = compile_grammar(tokenizer, "regex", r"[a-c]{1,2}-\d", vocab_size=4096)
    view = fsm_mask_widget(compiled, tokenizer)
    assert repr(view).startswith("Text view of the FSM-mask widget") and "state 0" in repr(view)
    assert "packed mask: 128 int32 words" in view.text()
