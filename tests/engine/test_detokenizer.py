"""Incremental detokenizer: equals a full decode (emoji, CJK, split bytes), stop strings, hold-back."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini.engine import EngineCoreRequest
from mini.engine.detokenizer import (
    IncrementalDetokenizer,
    OffsetIncrementalDetokenizer,
    check_stop_strings,
    detokenize_incrementally,
)
from mini.sampling_params import SamplingParams

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Ünïcödé façade naïve café, déjà vu",
    "日本語のテキストと中文字符，你好世界",
    "emoji 😀🎉🚀👩‍💻 party time 🇫🇷",
    "stop STOP end. The END",
] * 3
TEXTS = [
    "café 😀 日本語",
    "Hello 👩‍💻 world 🇫🇷!",
    "你好世界 and déjà vu",
    "🚀🚀🚀 naïve 中文字符",
    "The quick brown fox 😀 jumps",
]


def build_tokenizer():
    """A tiny byte-level BPE (GPT-2 style) trained in memory: multi-byte characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


TOKENIZER = None


def shared_tokenizer():
    global TOKENIZER
    if TOKENIZER is None:
        TOKENIZER = build_tokenizer()
    return TOKENIZER


def make_request(prompt_ids, **params) -> EngineCoreRequest:
    return EngineCoreRequest("r", None, list(prompt_ids), SamplingParams(**params), None, 0.0)


def run(tokenizer, output_ids, prompt="Hello world", chunk=1, stop_terminated=False, **params):
    detok = IncrementalDetokenizer.from_new_request(tokenizer, make_request(tokenizer.encode(prompt), **params))
    stop_string = None
    for start in range(0, len(output_ids), chunk):
        piece = output_ids[start:start + chunk]
        last = start + chunk >= len(output_ids)
        stop_string = detok.update(piece, stop_terminated and last)
        if stop_string is not None:
            break
    return detok, stop_string


def test_tokenizer_splits_characters_across_tokens(tokenizer):
    # Sanity for the tests below: some prefix decodes to a trailing replacement character.
    ids = tokenizer.encode(TEXTS[0])
    assert any(tokenizer.decode(ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))


@pytest.mark.parametrize("text", TEXTS)
def test_every_prefix_matches_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    streaming = IncrementalDetokenizer.from_new_request(tokenizer, make_request(tokenizer.encode("Hi ")))
    for i in range(1, len(ids) + 1):
        streaming.update([ids[i - 1]], False)
        expected = tokenizer.decode(ids[:i])
        shown = streaming.get_next_output_text(finished=False, delta=False)
        # While running, an incomplete character is held back, never shown as garbage.
        assert "\ufffd" not in shown
        assert expected.startswith(shown)
        if not expected.endswith("\ufffd"):
            assert shown == expected  # complete text is shown at once
        # A request that ends here gets exactly the full decode, incomplete bytes included.
        finished, _ = run(tokenizer, ids[:i], prompt="Hi ")
        assert finished.get_next_output_text(finished=True, delta=False) == expected
    assert streaming.get_next_output_text(finished=True, delta=False) == text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_token_sequence_matches_full_decode(data):
    tokenizer = shared_tokenizer()
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=24), label="ids")
    skip_special = data.draw(st.booleans(), label="skip_special_tokens")
    chunk = data.draw(st.integers(1, 4), label="chunk")
    detok, _ = run(tokenizer, ids, chunk=chunk, skip_special_tokens=skip_special)
    assert detok.output_token_ids == ids
    assert detok.get_next_output_text(True, False) == tokenizer.decode(ids, skip_special_tokens=skip_special)


@pytest.mark.parametrize("text", TEXTS)
def test_delta_pieces_concatenate_to_full_text(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer.from_new_request(tokenizer, make_request([5, 6]))
    pieces = []
    for token_id in ids:
        detok.update([token_id], False)
        pieces.append(detok.get_next_output_text(finished=False, delta=True))
    pieces.append(detok.get_next_output_text(finished=True, delta=True))
    assert "".join(pieces) == text
    assert detok.get_next_output_text(finished=True, delta=True) == ""


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hello") + [tokenizer.eos_token_id] + tokenizer.encode(" world")
    skipped, _ = run(tokenizer, ids)
    kept, _ = run(tokenizer, ids, skip_special_tokens=False)
    assert skipped.get_next_output_text(True, False) == "Hello world"
    assert kept.get_next_output_text(True, False) == "Hello</s> world"


def test_no_tokenizer_or_detokenize_false_keeps_text_empty(tokenizer):
    ids = tokenizer.encode("café 😀")
    detok = IncrementalDetokenizer.from_new_request(None, make_request([1, 2]))
    assert detok.update(ids, False) is None
    assert detok.output_token_ids == ids
    assert detok.get_next_output_text(True, False) == ""
    off, _ = run(tokenizer, ids, detokenize=False)
    assert type(off) is IncrementalDetokenizer
    assert off.output_token_ids == ids and off.get_next_output_text(True, True) == ""


def test_stop_token_text_hidden_unless_included(tokenizer):
    ids = tokenizer.encode("Hello") + [tokenizer.eos_token_id]
    hidden, _ = run(tokenizer, ids, stop_terminated=True, skip_special_tokens=False)
    assert hidden.get_next_output_text(True, False) == "Hello"
    assert hidden.output_token_ids == ids
    shown, _ = run(tokenizer, ids, stop_terminated=True, skip_special_tokens=False,
                   include_stop_str_in_output=True)
    assert shown.get_next_output_text(True, False) == "Hello</s>"


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize(
    "text,stop,include,expected_text",
    [
        ("The quick brown fox jumps over", ["brown fox"], False, "The quick "),
        ("The quick brown fox jumps over", ["brown fox"], True, "The quick brown fox"),
        ("The quick brown fox jumps over", ["zebra", "fox", "quick"], False, "The "),
        ("café 😀 日本語 done", ["日本"], False, "café 😀 "),
        ("café 😀 日本語 done", ["😀"], True, "café 😀"),
        ("你好世界 and déjà vu", ["é"], False, "你好世界 and d"),
        ("Hello world", ["world"], True, "Hello world"),
    ],
)
def test_stop_strings(tokenizer, chunk, text, stop, include, expected_text):
    ids = tokenizer.encode(text)
    detok, stop_string = run(tokenizer, ids, chunk=chunk, stop=stop, include_stop_str_in_output=include)
    # the stop string that ends earliest wins (vLLM v0.33.0), whatever the chunking
    expected_stop = min(stop, key=lambda s: (text.find(s) + len(s) if s in text else len(text) + 1))
    assert stop_string == expected_stop
    assert detok.get_next_output_text(finished=True, delta=False) == expected_text
    # Further tokens after the stop do not change anything.
    assert detok.update(tokenizer.encode(" more"), False) is None
    assert detok.get_next_output_text(finished=True, delta=False) == expected_text


def test_stop_string_spanning_tokens_is_found_across_updates(tokenizer):
    text = "The quick brown fox"
    ids = tokenizer.encode(text)
    stop = "k br"  # ends one token, starts the next one: found only with the look-back window
    assert not any(stop in tokenizer.decode([token_id]) for token_id in ids)
    detok, stop_string = run(tokenizer, ids, stop=[stop])
    assert stop_string == stop
    assert detok.get_next_output_text(True, False) == "The quic"


def test_no_stop_string_means_no_stop(tokenizer):
    detok, stop_string = run(tokenizer, tokenizer.encode("Hello world 😀"), stop=["xyz", "日本"])
    assert stop_string is None
    assert detok.get_next_output_text(True, False) == "Hello world 😀"


def test_stop_buffer_holds_back_possible_stop_prefix(tokenizer):
    ids = tokenizer.encode("Hello world")
    detok, _ = run(tokenizer, ids, stop=["wxyz"])  # buffer = 3 characters
    assert detok.get_next_output_text(finished=False, delta=False) == "Hello wo"
    assert detok.get_next_output_text(finished=True, delta=False) == "Hello world"
    delta = IncrementalDetokenizer.from_new_request(tokenizer, make_request([5], stop=["wxyz"]))
    delta.update(ids, False)
    assert delta.get_next_output_text(False, True) == "Hello wo"
    assert delta.get_next_output_text(True, True) == "rld"


def test_min_tokens_delays_stop_strings(tokenizer):
    ids = tokenizer.encode("stop stop stop")
    per_token_text = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    first_stop_end = next(i for i, t in enumerate(per_token_text) if "stop" in t)
    detok, stop_string = run(tokenizer, ids, stop=["stop"], min_tokens=first_stop_end)
    assert stop_string == "stop"
    assert detok.get_next_output_text(True, False).startswith(per_token_text[first_stop_end])
    assert len(detok.output_token_ids) > first_stop_end


def test_check_stop_strings_unit():
    assert check_stop_strings("abc", 0, ["b"], False) is None
    assert check_stop_strings("hello world", 5, ["o w"], False) == ("o w", 4)      # straddles the new text
    assert check_stop_strings("hello world", 3, ["o w"], False) is None            # entirely old text
    assert check_stop_strings("hello world", 5, ["world"], True) == ("world", -1)
    assert check_stop_strings("hello world!", 6, ["world"], True) == ("world", 11)
    assert check_stop_strings("xx ab cd", 8, ["cd", "ab"], False) == ("ab", 3)     # earliest match wins


@pytest.mark.parametrize(("text", "new", "stop", "include", "expected"), [
    ("abcd", 4, ["abcd", "bc"], False, ("bc", 1)),      # "bc" ends first although "abcd" starts first
    ("abcd", 4, ["abcd", "bc"], True, ("bc", 3)),
    ("xabc", 4, ["abc", "bc"], False, ("abc", 1)),      # both end at 4: the first in the list wins
    ("xabc", 4, ["bc", "abc"], False, ("bc", 2)),
    ("xabc", 4, ["bc", "abc"], True, ("bc", -1)),
    ("ab\n\nc", 3, ["c", "\n\n"], False, ("\n\n", 2)),  # straddling match ending before a later one
])
def test_check_stop_strings_earliest_end_wins_as_vllm(text, new, stop, include, expected):
    assert check_stop_strings(text, new, stop, include) == expected


def test_tokens_after_the_stop_string_are_dropped(tokenizer):
    ids = tokenizer.encode("The quick brown fox jumps")
    texts = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    completes = next(i for i, t in enumerate(texts) if "quick" in t)
    assert completes < len(ids)
    for include in (False, True):
        detok, stop_string = run(tokenizer, ids, chunk=len(ids), stop=["quick"], include_stop_str_in_output=include)
        assert stop_string == "quick"
        assert detok.output_token_ids == ids[:completes]   # one update with every token (spec decode)
        assert detok.get_next_output_text(True, False) == ("The quick" if include else "The ")


def test_stop_strings_checked_when_the_core_stopped_too(tokenizer):
    ids = tokenizer.encode("Hello world") + [tokenizer.eos_token_id]
    detok, stop_string = run(tokenizer, ids, chunk=len(ids), stop_terminated=True, stop=["world"])
    assert stop_string == "world" and detok.get_next_output_text(True, False) == "Hello "


def test_detokenize_incrementally_holds_incomplete_characters(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1
    tokens: list[str] = []
    prefix_offset = read_offset = 0
    texts = []
    for token in tokenizer.convert_ids_to_tokens(ids):
        tokens.append(token)
        text, prefix_offset, read_offset = detokenize_incrementally(tokenizer, tokens, prefix_offset, read_offset)
        texts.append(text)
    assert texts[:-1] == [""] * (len(ids) - 1)
    assert texts[-1] == "😀"
    assert read_offset == len(tokens)


def test_offset_detokenizer_class_is_used_with_tokenizer(tokenizer):
    assert isinstance(IncrementalDetokenizer.from_new_request(tokenizer, make_request([1])),
                      OffsetIncrementalDetokenizer)


def build_sentencepiece_style_tokenizer():
    """A Llama-style tokenizer: Metaspace words, byte fallback (<0xF0> ...) for characters not in the vocab."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=specials, show_progress=False, limit_alphabet=60)
    tokenizer.train_from_iterator(["Hello world! The quick brown fox.", "café déjà vu", "stop END"] * 3, trainer)
    # Add the 256 byte tokens right after the specials, as SentencePiece models with byte_fallback have them.
    spec = json.loads(tokenizer.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    ordered = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in trained if t not in specials]
    spec["model"]["vocab"] = {token: index for index, token in enumerate(ordered)}
    for added in spec["added_tokens"]:
        added["id"] = ordered.index(added["content"])
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def test_sentencepiece_style_tokenizer_decodes_in_context():
    """Llama-style: a word's leading space comes from its token; with the prompt as context the output text
    keeps it (as vLLM: " world", where decode(output_ids) alone would drop it)."""
    tokenizer = build_sentencepiece_style_tokenizer()
    prompt_ids = tokenizer.encode("Hello")
    full_ids = tokenizer.encode("Hello café 😀 日本語 fox")
    assert full_ids[:len(prompt_ids)] == prompt_ids
    output_ids = full_ids[len(prompt_ids):]
    assert "<0xF0>" in tokenizer.convert_ids_to_tokens(output_ids)  # the emoji is byte-fallback tokens
    prompt_text = tokenizer.decode(prompt_ids)
    streaming = IncrementalDetokenizer.from_new_request(tokenizer, make_request(prompt_ids))
    for i in range(1, len(output_ids) + 1):
        streaming.update([output_ids[i - 1]], False)
        in_context = tokenizer.decode(prompt_ids + output_ids[:i])[len(prompt_text):]
        shown = streaming.get_next_output_text(finished=False, delta=False)
        # (byte fallback decodes a run of byte tokens with an incomplete character as all U+FFFD, so an
        # incomplete prefix is not a prefix of the final text: only complete texts are compared.)
        assert "\ufffd" not in shown
        if "\ufffd" not in in_context:
            assert shown == in_context
            ended = IncrementalDetokenizer.from_new_request(tokenizer, make_request(prompt_ids))
            ended.update(output_ids[:i], False)
            assert ended.get_next_output_text(finished=True, delta=False) == in_context
    assert streaming.get_next_output_text(True, False) == " café 😀 日本語 fox"
