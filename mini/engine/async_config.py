"""Which engines may run with async scheduling (vLLM: the async-scheduling checks in `VllmConfig.__post_init__`,
vllm/config/vllm.py).

vLLM v0.33.0 turns `async_scheduling` on by default (`None` -> True) unless something it cannot overlap is
configured, and raises when it is asked for explicitly with one: pipeline parallelism and, on its V1 model
runner, speculative decoding other than EAGLE / draft-model / GPU n-gram (so the CPU `ngram` proposer is
refused). mini's default is False: on a CPU the forward and the host work share the same few cores, so the
overlap buys little there (mini/bench/async_scheduling.py measures it), and the course's step-by-step views
want one step at a time. mini refuses every speculative method with it: its drafts come back through the
scheduler after each step (`ModelRunnerOutput.spec_token_ids`), which a step scheduled before that output
cannot have; vLLM keeps them on the worker instead. mini has no pipeline parallelism.
"""

from __future__ import annotations

from typing import Any


def validate_async_scheduling(config: Any) -> None:
    """Raise ValueError, naming the fields, for a combination async scheduling cannot keep exact."""
    value = config.async_scheduling
    if value is not True and value is not False:
        raise ValueError(f"async_scheduling must be a bool (True or False), got {value!r}")
    if not value:
        return
    spec = config.speculative_config
    if spec is not None:
        raise ValueError(
            f"async_scheduling=True cannot be combined with speculative_config (method {spec.method!r}): the "
            "drafts of step N reach the scheduler only after step N, and with async scheduling step N+1 is "
            "scheduled before that (vLLM refuses 'ngram' too); use async_scheduling=False")
    if int(getattr(config, "pipeline_parallel_size", 1) or 1) > 1:
        raise ValueError("async_scheduling=True cannot be combined with pipeline_parallel_size > 1 (as vLLM's "
                         "V1 model runner)")
