"""Errors the front end raises when the engine core fails (mirrors vllm/v1/engine/exceptions.py).

`EngineDeadError`: the engine core is gone (its process died, was shut down, or hit an error it cannot
recover from); every request in flight and every later call fails with it. `EngineStepError` (mini only;
vLLM folds it into `EngineGenerateError`): one step raised inside the core; the requests in flight were
aborted and failed with it, and the core serves new requests.
"""


class EngineDeadError(RuntimeError):
    """The engine core has stopped (shut down, its process died, or it failed beyond repair)."""


class EngineStepError(RuntimeError):
    """A step of the engine core raised while this request was in flight; the request was aborted."""


class EngineInternalsError(RuntimeError):
    """An engine internal (scheduler, model runner, step observers) asked of an engine whose core runs in
    another process."""
