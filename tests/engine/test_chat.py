"""`LLM.chat` (vLLM's) and `python -m mini chat` (streams through the engine loop, keeps the history).

On the shipped tiny model, which has no chat template: the fallback template of
mini/entrypoints/chat_utils.py is used. SmolLM2's real template is covered in tests/model/test_smollm2.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from patience import RUN_GUARD_S

from mini import LLM, SamplingParams
from mini.config import SHIPPED_MODEL_DIR
from mini.entrypoints.chat_cli import stream_reply

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=256)


def test_chat_renders_the_template_and_generates_like_generate(llm):
    conversation = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "def add(a, b):"}]
    [output] = llm.chat(conversation, GREEDY, use_tqdm=False)
    assert output.prompt == "system: Be terse.\nuser: def add(a, b):\nassistant:"
    [direct] = llm.generate(output.prompt, GREEDY, use_tqdm=False)
    assert output.outputs[0].token_ids == direct.outputs[0].token_ids
    assert len(output.outputs[0].token_ids) == 8


def test_chat_takes_a_list_of_conversations_and_template_options(llm):
    first = [{"role": "user", "content": "import os"}]
    second = [{"role": "user", "content": "class A:"}, {"role": "assistant", "content": "    pass"}]
    outputs = llm.chat([first, second], GREEDY, use_tqdm=False, add_generation_prompt=False)
    assert [o.prompt for o in outputs] == ["user: import os\n", "user: class A:\nassistant:     pass\n"]
    [custom] = llm.chat(first, GREEDY, use_tqdm=False, chat_template="{{ messages[0]['content'] }}!")
    assert custom.prompt == "import os!"
    # vLLM's content parts form: a list of {"type": "text"} parts
    [parts] = llm.chat([{"role": "user", "content": [{"type": "text", "text": "import os"}]}], GREEDY,
                       use_tqdm=False)
    assert parts.prompt == "user: import os\nassistant:"


@pytest.mark.parametrize("messages, error, match", [
    ([{"role": "wizard", "content": "hi"}], ValueError, r"messages\[0\]\['role'\] must be one of"),
    ([{"role": "user", "content": {"image": 1}}], ValueError, r"\['content'\] must be a str"),
    ([], ValueError, "at least one message"),
    ("hello", TypeError, "messages must be"),
    ([[{"role": "user", "content": "a"}], "b"], TypeError, r"messages\[1\] must be a list"),
])
def test_bad_messages_raise_and_queue_nothing(llm, messages, error, match):
    with pytest.raises(error, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_continue_final_message_needs_an_assistant_turn(llm):
    with pytest.raises(ValueError, match="add_generation_prompt and continue_final_message"):
        llm.chat([{"role": "assistant", "content": "x"}], GREEDY, continue_final_message=True, use_tqdm=False)
    with pytest.raises(ValueError, match="role to be 'assistant'"):
        llm.chat([{"role": "user", "content": "x"}], GREEDY, continue_final_message=True,
                 add_generation_prompt=False, use_tqdm=False)


def test_stream_reply_streams_pieces_that_add_up_to_the_chat_reply(llm):
    conversation = [{"role": "user", "content": "def main():"}]
    pieces: list[str] = []
    reply = stream_reply(llm, conversation, SamplingParams(temperature=0.0, max_tokens=12), pieces.append)
    assert len(pieces) > 1, "the reply should arrive in several pieces, step by step"
    assert "".join(pieces) == reply
    [expected] = llm.chat(conversation, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    assert reply == expected.outputs[0].text
    assert not llm.llm_engine.has_unfinished_requests()


def run_chat_cli(stdin: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [sys.executable, "-m", "mini", "chat", str(SHIPPED_MODEL_DIR), "--temperature", "0",
         "--max-tokens", "6", "--max-model-len", "256", *args],
        input=stdin, capture_output=True, text=True, timeout=RUN_GUARD_S, cwd=REPO_ROOT, env=env, check=False,
    )


def test_chat_cli_keeps_the_history_and_exits_on_command(llm):
    result = run_chat_cli("import os\n\n/reset\ndef f():\nclass A:\n/exit\nnever sent\n")
    assert result.returncode == 0, result.stderr
    params = SamplingParams(temperature=0.0, max_tokens=6)
    [first] = llm.chat([{"role": "user", "content": "import os"}], params, use_tqdm=False)
    [after_reset] = llm.chat([{"role": "user", "content": "def f():"}], params, use_tqdm=False)
    history = [{"role": "user", "content": "def f():"},
               {"role": "assistant", "content": after_reset.outputs[0].text},
               {"role": "user", "content": "class A:"}]
    [second_turn] = llm.chat(history, params, use_tqdm=False)
    replies = [first.outputs[0].text, after_reset.outputs[0].text, second_turn.outputs[0].text]
    assert result.stdout == "".join(reply + "\n" for reply in replies)
    assert "/exit" in result.stderr  # the banner goes to stderr, replies alone to stdout


def test_chat_cli_exits_at_end_of_input_and_reports_bad_models(llm):
    result = run_chat_cli("import os\n")
    [reply] = llm.chat([{"role": "user", "content": "import os"}], SamplingParams(temperature=0.0, max_tokens=6),
                       use_tqdm=False)
    assert result.returncode == 0 and result.stdout == reply.outputs[0].text + "\n", result.stderr
    bad = subprocess.run([sys.executable, "-m", "mini", "chat", "nobody/no-such-model"], input="",
                         capture_output=True, text=True, timeout=RUN_GUARD_S, cwd=REPO_ROOT,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"), check=False)
    assert bad.returncode == 2 and "not a local folder" in bad.stderr
