"""Chat messages -> one prompt string, through the tokenizer's chat template.

Mirrors `parse_chat_messages` in vllm/renderers/chat_utils/chat_message.py and the chat rendering of
vllm/renderers/hf.py (`HfRenderer.render_messages`, `safe_apply_chat_template`): vLLM checks the OpenAI-style
messages, then renders them with the tokenizer's Jinja chat template
(`tokenizer.apply_chat_template(..., tokenize=False)`). (Before the renderers, vLLM kept both in
`entrypoints/chat_utils.py`.) mini accepts text content only
(a str, or a list of `{"type": "text", "text": ...}` parts, joined).

A tokenizer without a chat template (the shipped tiny model has none) gets `FALLBACK_CHAT_TEMPLATE`,
one line per message and an `assistant:` cue:

    system: You are terse.
    user: Hi
    assistant:
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ChatMessage = Mapping[str, Any]
Conversation = Sequence[ChatMessage]

ROLES = ("system", "user", "assistant", "tool", "developer")

FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def is_single_conversation(messages: Any) -> bool:
    """One conversation is a list of message dicts; a batch is a list of such lists (as vLLM's LLM.chat)."""
    return isinstance(messages, Sequence) and not isinstance(messages, str) and (
        len(messages) == 0 or isinstance(messages[0], Mapping)
    )


def normalize_conversation(conversation: Any, index: int | None = None) -> list[dict[str, str]]:
    """Check one conversation; -> list of {"role", "content"} with str content. ValueError/TypeError if bad."""
    where = "messages" if index is None else f"messages[{index}]"
    if isinstance(conversation, str) or not isinstance(conversation, Sequence):
        raise TypeError(f"{where} must be a list of {{'role': ..., 'content': ...}} dicts, "
                        f"got {type(conversation).__name__}")
    if len(conversation) == 0:
        raise ValueError(f"{where} must hold at least one message, got an empty list")
    normalized = []
    for position, message in enumerate(conversation):
        if not isinstance(message, Mapping):
            raise TypeError(f"{where}[{position}] must be a dict with 'role' and 'content', "
                            f"got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}[{position}]['role'] must be one of {ROLES}, got {role!r}")
        normalized.append({"role": role, "content": _text_content(message.get("content"), f"{where}[{position}]")})
    return normalized


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and all(
        isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "\n".join(part["text"] for part in content)
    raise ValueError(f"{where}['content'] must be a str or a list of {{'type': 'text', 'text': str}} parts "
                     f"(mini has no image or audio input), got {content!r}")


def apply_chat_template(
    tokenizer: Any,
    conversation: list[dict[str, str]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Render the conversation with `chat_template`, else the tokenizer's, else the fallback template."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("add_generation_prompt and continue_final_message cannot both be True "
                         "(continue the last message, or start a new assistant turn)")
    if continue_final_message and conversation[-1]["role"] != "assistant":
        raise ValueError("continue_final_message=True needs the last message's role to be 'assistant', "
                         f"got {conversation[-1]['role']!r}")
    template = chat_template or getattr(tokenizer, "chat_template", None) or FALLBACK_CHAT_TEMPLATE
    rendered = tokenizer.apply_chat_template(
        conversation,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        **(chat_template_kwargs or {}),
    )
    if not isinstance(rendered, str):
        raise TypeError(f"the chat template rendered a {type(rendered).__name__}, expected a str")
    return rendered


def has_own_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
