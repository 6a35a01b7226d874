"""The prefix-cache view: recorded chains, hits, shared blocks and evictions of a real engine run."""

from __future__ import annotations

from labs.views.prefix_cache import prefix_cache_widget, record_prefix_cache, render_prefix_cache_html
from mini import LLM, SamplingParams


def test_recording_shows_hits_salt_misses_and_evictions(tiny_llama_dir):
    system = list(range(1, 13))
    prompts = [{"prompt_token_ids": system + [20]}, {"prompt_token_ids": system + [21]},
               {"prompt_token_ids": system + [21], "cache_salt": "b"}, {"prompt_token_ids": list(range(100, 130))}]
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=12,
              enable_prefix_caching=True)
    recording = record_prefix_cache(llm, prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    last = recording.snapshots[-1]
    assert recording.request_ids == ["r0", "r1", "r2", "r3"]
    assert last.num_cached_tokens == {"r0": 0, "r1": 12, "r2": 0, "r3": 0}
    assert last.chains["r0"][:3] == last.chains["r1"][:3] and not set(last.chains["r2"]) & set(last.chains["r0"])
    assert any("evicted" in event for snap in recording.snapshots for event in snap.events)
    assert last.hits == 12 and last.free_queue and all(count == 0 for count in last.ref_cnts)
    page = render_prefix_cache_html(last, recording.request_ids)
    assert "hit rate" in page and "r1" in page
    widget = prefix_cache_widget(recording)
    assert len(widget.pages) == len(recording)
    (play, slider), board = widget.children[0].children, widget.children[1]
    # jslink copies the play button's value into the slider in the browser: all three start on one step
    assert play.value == slider.value and board.value == widget.pages[slider.value]
    # the text twin (phase 10's hash chains without a widget front end)
    text = widget.text(len(recording) - 1)
    assert text.startswith("Text view of the prefix-cache widget") and "hit rate" in text
    assert "r1 (finished, 12 cached)" in text and "[hit]" in text and "free queue, evicted first" in text
    assert widget._repr_mimebundle_()["text/plain"] == widget.text()
