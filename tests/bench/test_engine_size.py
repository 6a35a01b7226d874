"""`python -m mini bench`: the workload's size follows the model (same shape, a few minutes on 2 cores), 3 rounds
always (a median and a spread)."""

from __future__ import annotations

from mini.bench import engine as bench


def parsed(*argv: str):
    args = bench.build_parser().parse_args(list(argv))
    bench.apply_default_size(args)
    return args


def test_shipped_model_keeps_the_full_workload():
    args = parsed()
    assert (args.num_prompts, args.rounds) == (128, 3)
    assert tuple(args.prompt_len) == (16, 256) and tuple(args.output_len) == (16, 256)


def test_a_real_model_runs_fewer_prompts_of_the_same_shape():
    args = parsed("--model", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert (args.num_prompts, args.rounds) == (8, 3)
    assert tuple(args.prompt_len) == (16, 256) and tuple(args.output_len) == (16, 256)


def test_explicit_sizes_win():
    args = parsed("--model", "x", "--num-prompts", "3", "--rounds", "5")
    assert (args.num_prompts, args.rounds) == (3, 5)


def test_compilation_mode_is_mini_s_two_modes(capsys):
    import pytest

    assert parsed().compilation_config is None            # the engine's default (eager)
    assert parsed("-O", "3").compilation_config == 3
    with pytest.raises(SystemExit):
        parsed("-O", "2")                                 # vLLM's mode 2: mini does not have it
    assert "invalid choice" in capsys.readouterr().err
