"""Mirrors vllm/v1/engine/detokenizer.py (+ vllm/tokenizers/detokenizer_utils.py): token ids -> text.

Text is produced one token at a time, as the tokens arrive. Decoding each token on its own is wrong:
a character can be split over several byte-level tokens, and tokenizers such as SentencePiece decide
spaces from the neighbouring tokens. vLLM's answer (the "slow" incremental detokenizer, used here for
every tokenizer) keeps the token strings in a list and two offsets into it:

  tokens[prefix_offset:read_offset]  the last few tokens already turned into text (context only)
  tokens[read_offset:]               tokens whose text is not emitted yet

Each step decodes the window `tokens[prefix_offset:]`, removes the text of the context part and emits
the rest, unless it ends in U+FFFD: then a multi-byte character is still incomplete and the text waits
for the next token. When the request finishes, whatever is still held back is flushed. The window
starts with the last prompt tokens, so the output is decoded in context: for byte-level BPE tokenizers
(GPT-2, Llama 3, Qwen) the final text equals `tokenizer.decode(output_ids, skip_special_tokens=...)`
for any token sequence; SentencePiece-style tokenizers keep the leading space of the first word
(" world", as vLLM), which `decode(output_ids)` alone would strip. The EOS / stop token that ended
the request stays in the token ids but not in the text (unless include_stop_str_in_output), as vLLM v1.

Stop strings are searched in the newly produced text (plus `len(stop) - 1` characters before it, so a
stop string split across tokens is found too); when several match, the one that ends earliest wins (ties:
the first in `stop`). On a match the text is cut before the stop string (or after it with
`include_stop_str_in_output`), token ids after the one completing it are dropped, and the request
finishes with finish_reason "stop".

vLLM uses `tokenizers`' `DecodeStream` (FastIncrementalDetokenizer) for fast tokenizers and the offset
algorithm (SlowIncrementalDetokenizer, `detokenize_incrementally` in vllm/tokenizers/detokenizer_utils.py)
otherwise; mini's choice: the offset algorithm for every tokenizer (same text on byte-level BPE).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mini.engine import EngineCoreRequest

# How many prompt tokens before the first output token serve as decoding context (vLLM uses 5).
INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
REPLACEMENT_CHAR = "\ufffd"


def detokenize_incrementally(
    tokenizer: Any, tokens: list[str], prefix_offset: int, read_offset: int
) -> tuple[str, int, int]:
    """Text of the unread tokens at the end of `tokens` -> (new_text, new_prefix_offset, new_read_offset).

    `tokens` already holds the newly arrived token strings at its end. If their text is not complete yet
    (it ends in the replacement character, or adds nothing), return "" and leave the offsets unchanged.
    """
    prefix_text = tokenizer.convert_tokens_to_string(tokens[prefix_offset:read_offset])
    new_text = tokenizer.convert_tokens_to_string(tokens[prefix_offset:])
    if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
        return "", prefix_offset, read_offset
    return new_text[len(prefix_text):], read_offset, len(tokens)


def check_stop_strings(
    output_text: str, new_char_count: int, stop: list[str], include_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string in the last `new_char_count` characters (and the len(stop)-1 before them).

    Returns (stop_string, truncate_to) or None. `truncate_to` is where the text must be cut, or -1 if the
    text ends exactly after an included stop string. If several match, the one that ENDS earliest wins
    (what appending one token at a time would have found first), ties broken by the order of `stop`, as
    `check_stop_strings` in vllm/v1/engine/detokenizer.py.
    """
    if not new_char_count or not stop:
        return None
    best: tuple[int, int, str] | None = None  # (end, start, stop string)
    for stop_str in stop:
        # Start early enough that a stop string straddling old and new text is found.
        start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
        index = output_text.find(stop_str, start)
        if index == -1:
            continue
        end = index + len(stop_str)
        if best is None or end < best[0]:  # strictly earlier: an equal end keeps the earlier list entry
            best = (end, index, stop_str)
    if best is None:
        return None
    end, index, stop_str = best
    if not include_in_output:
        return stop_str, index
    return stop_str, (-1 if end >= len(output_text) else end)


class IncrementalDetokenizer:
    """No tokenizer (skip_tokenizer_init) or detokenize=False: keep the token ids, text stays ""."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    @property
    def output_text(self) -> str:
        return ""

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Add new tokens; return the stop string that ended the request, if one did."""
        self.token_ids.extend(new_token_ids)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        return ""

    @classmethod
    def from_new_request(cls, tokenizer: Any | None, request: EngineCoreRequest,
                         text_detokenizer: type[OffsetIncrementalDetokenizer] | None = None
                         ) -> IncrementalDetokenizer:
        """The request's detokenizer: `text_detokenizer` (the output processor's choice, by default
        OffsetIncrementalDetokenizer) when it wants text, else one that only keeps the ids."""
        if tokenizer is None or not request.sampling_params.detokenize:
            return IncrementalDetokenizer()
        return (text_detokenizer or OffsetIncrementalDetokenizer)(tokenizer, request)


class OffsetIncrementalDetokenizer(IncrementalDetokenizer):
    """vLLM's prefix_offset/read_offset detokenizer (SlowIncrementalDetokenizer) + stop strings.

    Home of the `detokenizer` role's parts (mini/roles.py): `detokenize_incrementally` and
    `check_stop_strings`; the output processor builds its detokenizers from `roles.resolve(config, ...)` of this
    class, so an engine built with other parts uses a subclass holding them.
    """

    detokenize_incrementally = staticmethod(detokenize_incrementally)
    check_stop_strings = staticmethod(check_stop_strings)

    def __init__(self, tokenizer: Any, request: EngineCoreRequest) -> None:
        super().__init__()
        params = request.sampling_params
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stop: list[str] = list(params.stop)
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        # Characters held back from streamed output: they might still turn out to start a stop string.
        self.stop_buffer_length = params.output_text_buffer_length
        self._output_text = ""
        self._last_output_text_offset = 0
        self._stopped_on_string = False
        # Prime the token window with the end of the prompt, so the first output token decodes in context.
        context_ids = request.prompt_token_ids[-(INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 2):]
        self.tokens: list[str] = list(
            tokenizer.convert_ids_to_tokens(context_ids, skip_special_tokens=self.skip_special_tokens)
        )
        self.read_offset = len(self.tokens)
        self.prefix_offset = max(self.read_offset - INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, 0)

    @property
    def output_text(self) -> str:
        return self._output_text

    def decode_next(self, token_id: int) -> str:
        """Append one token and return the text that became final because of it (maybe "")."""
        self.tokens.extend(
            self.tokenizer.convert_ids_to_tokens([token_id], skip_special_tokens=self.skip_special_tokens)
        )
        new_text, self.prefix_offset, self.read_offset = self.detokenize_incrementally(
            self.tokenizer, self.tokens, self.prefix_offset, self.read_offset
        )
        return new_text

    def flush(self) -> str:
        """Text still held back (an incomplete character at the very end), emitted when the request ends."""
        if self.read_offset >= len(self.tokens):
            return ""
        prefix_text = self.tokenizer.convert_tokens_to_string(self.tokens[self.prefix_offset:self.read_offset])
        full_text = self.tokenizer.convert_tokens_to_string(self.tokens[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.tokens)
        return full_text[len(prefix_text):]

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Detokenize the new tokens, then look for a stop string (`BaseIncrementalDetokenizer.update`).

        A stop string is searched only in the text of tokens past the first `min_tokens`. On a match the
        text is cut (`truncate_to`), and the token ids that came after the token completing the stop
        string are dropped (several tokens can arrive in one step with speculative decoding): the output
        processor trims `new_token_ids` to match (`OutputProcessor._trim_surplus_tokens` in vLLM).
        """
        if not new_token_ids or self._stopped_on_string:
            return None
        # The EOS / stop token that ended the request is kept in token_ids but not shown as text
        # (unless include_stop_str_in_output), as in vLLM v1.
        skipped_stop_token_id = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped_stop_token_id = new_token_ids[-1]
            new_token_ids = new_token_ids[:-1]
        num_prev_tokens = len(self.token_ids)
        token_offsets = [len(self._output_text)]  # text length at each boundary between new tokens
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            self._output_text += self.decode_next(token_id)
            token_offsets.append(len(self._output_text))
        if skipped_stop_token_id is not None:
            self.token_ids.append(skipped_stop_token_id)
            token_offsets.append(len(self._output_text))
        if not self.stop or len(self.token_ids) <= self.min_tokens:
            return None
        stop_check_offset = token_offsets[max(self.min_tokens - num_prev_tokens, 0)]
        match = self.check_stop_strings(
            self._output_text, len(self._output_text) - stop_check_offset, self.stop,
            self.include_stop_str_in_output,
        )
        if match is None:
            return None
        stop_str, truncate_to = match
        stop_end = len(self._output_text) if truncate_to == -1 else truncate_to
        if not self.include_stop_str_in_output:
            stop_end += len(stop_str)
        # Keep the tokens up to the one whose text completes the stop string.
        num_kept = bisect.bisect_left(token_offsets, stop_end, lo=1)
        del self.token_ids[num_prev_tokens + num_kept:]
        if truncate_to != -1:
            self._output_text = self._output_text[:truncate_to]
        self._stopped_on_string = True
        return stop_str

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The whole text so far (delta=False) or the part not returned before (delta=True).

        While running, the last `stop_buffer_length` characters are held back; when finished, all of it.
        """
        if finished and not self._stopped_on_string:
            self._output_text += self.flush()
        buffer_length = 0 if finished else self.stop_buffer_length
        visible_length = len(self._output_text) - buffer_length
        if not delta:
            return self._output_text[:visible_length] if buffer_length else self._output_text
        last_offset = self._last_output_text_offset
        if last_offset >= visible_length:
            return ""
        self._last_output_text_offset = visible_length
        return self._output_text[last_offset:visible_length]
