"""The LoRA batch view (labs/views/lora_batch.py): its per-token slots are the mapping's, its rows the requests'."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import torch

from labs.views.lora_batch import lora_batch, plot_lora_batch, render_lora_batch_text

REQUESTS = [("r0", 3, 4), ("r1", 0, 1), ("r2", 5, 2), ("r3", 3, 1)]
TABLE = [5, None, 3]


def test_rows_and_tokens_follow_the_slot_table():
    batch = lora_batch(REQUESTS, TABLE, names={3: "sql", 5: "poems"})
    assert batch.token_slots == (2, 2, 2, 2, -1, 0, 0, 2)
    assert [(r.adapter, r.slot, r.first_token, r.num_tokens) for r in batch.rows] == [
        ("sql", 2, 0, 4), ("base", -1, 4, 1), ("poems", 0, 5, 2), ("sql", 2, 7, 1)]
    assert batch.slots == ((0, 5, "poems"), (1, None, "(empty)"), (2, 3, "sql"))
    assert batch.tokens_of_slot(2) == (0, 1, 2, 3, 7) and batch.tokens_of_slot(-1) == (4,)


def test_a_learner_mapping_is_what_is_drawn():
    def everything_base(req_lora_ids, num_scheduled_tokens, lora_index_to_id):
        return torch.full((int(num_scheduled_tokens.sum()),), -1, dtype=torch.int64)

    batch = lora_batch(REQUESTS, TABLE, compute_token_lora_indices=everything_base)
    assert batch.token_slots == (-1,) * 8 and batch.rows[0].slot == 2   # the rows still show the slot table


def test_text_and_plot():
    batch = lora_batch(REQUESTS, TABLE, names={3: "sql", 5: "poems"})
    text = render_lora_batch_text(batch)
    assert "token slots: 2 2 2 2 . 0 0 2" in text and "slot 0 (poems): shrink and expand read token rows [5, 6]" in text
    figure = plot_lora_batch(batch)
    assert len(figure.axes) == 2
