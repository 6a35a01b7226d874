"""`python -m mini bench agreement`: where two greedy runs split, and the printed summary on the tiny model."""

from __future__ import annotations

from mini.bench import agreement


def test_first_divergence():
    assert agreement.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert agreement.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert agreement.first_divergence([1, 2], [1, 2, 3]) == 2   # one stopped early


def test_the_shipped_tiny_model_agrees_with_transformers_in_float32(capsys):
    assert agreement.main(["--dtype", "float32", "--max-tokens", "4"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("greedy_identical=8/8 "), last   # float32: mini is token-identical to transformers
