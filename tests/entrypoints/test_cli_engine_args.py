"""`LLM(model, **engine_args)` and the command lines take their engine arguments from `EngineConfig`'s fields
(mini/config.py): one list of names, defaults and help texts."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from mini import LLM
from mini.__main__ import GENERATE_ENGINE_ARGS
from mini.__main__ import build_parser as generate_parser
from mini.config import (
    ENGINE_ARG_NAMES,
    EngineConfig,
    add_engine_arguments,
    cli_engine_args,
    engine_config_from_args,
)
from mini.entrypoints.chat_cli import CHAT_ENGINE_ARGS
from mini.entrypoints.chat_cli import build_parser as chat_parser
from mini.entrypoints.openai.api_server import SERVE_ENGINE_ARGS, add_serve_arguments, engine_args_from

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}


def test_llm_signature_lists_every_field_with_its_default():
    parameters = inspect.signature(LLM).parameters
    assert list(parameters) == list(ENGINE_ARG_NAMES)
    for name, parameter in parameters.items():
        default = FIELDS[name].default
        assert parameter.default == (None if default is dataclasses.MISSING else default), name


def test_every_field_has_help():
    assert [name for name, f in FIELDS.items() if not f.metadata.get("help")] == []


def test_unknown_engine_argument_is_refused_with_the_allowed_names(tiny_llama_dir):
    with pytest.raises(TypeError, match=r"unknown engine argument\(s\) 'max_num_seq'.*max_num_seqs"):
        LLM(model=str(tiny_llama_dir), max_num_seq=4)
    with pytest.raises(TypeError, match="'colour'"):
        engine_config_from_args(colour="blue")
    assert engine_config_from_args(logits_processors=None).logits_processors == []


@pytest.mark.parametrize("names", [SERVE_ENGINE_ARGS, CHAT_ENGINE_ARGS, GENERATE_ENGINE_ARGS])
def test_generated_flags_default_to_the_fields(names):
    parser = add_engine_arguments(argparse.ArgumentParser(), names)
    args = parser.parse_args([])
    assert cli_engine_args(args, names) == {name: FIELDS[name].default for name in names}
    for action in parser._actions[1:]:
        assert action.help.startswith(FIELDS[action.dest].metadata["help"])
        assert action.option_strings == ["--" + action.dest.replace("_", "-")]


def test_generated_flags_parse_into_an_engine_config():
    names = [name for name, f in FIELDS.items() if f.metadata.get("cli") is not False and name != "model"]
    parser = add_engine_arguments(argparse.ArgumentParser(), names)
    args = parser.parse_args(["--max-num-seqs", "8", "--enable-prefix-caching", "--no-enable-chunked-prefill",
                              "--max-num-batched-tokens", "4096", "--compilation-config", "0",
                              "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
                              "--gpu-memory-utilization", "0.5", "--scheduling-policy", "priority"])
    config = EngineConfig(**cli_engine_args(args, names))
    assert (config.max_num_seqs, config.enable_prefix_caching, config.enable_chunked_prefill) == (8, True, False)
    assert config.speculative_config.num_speculative_tokens == 2 and config.gpu_memory_utilization == 0.5
    with pytest.raises(SystemExit):
        parser.parse_args(["--scheduling-policy", "lifo"])


def test_the_three_command_lines_use_them():
    serve = add_serve_arguments(argparse.ArgumentParser()).parse_args(["--max-num-seqs", "3", "--port", "9"])
    assert engine_args_from(serve)["max_num_seqs"] == 3 and serve.port == 9
    chat = chat_parser().parse_args(["--seed", "5", "--dtype", "bfloat16"])
    assert cli_engine_args(chat, CHAT_ENGINE_ARGS)["seed"] == 5 and chat.dtype == "bfloat16"
    generate = generate_parser().parse_args(["generate", "hi", "--block-size", "4"])
    assert cli_engine_args(generate, GENERATE_ENGINE_ARGS)["block_size"] == 4 and generate.seed is None
