"""Mirrors vllm/v1/engine/parallel_sampling.py: `n > 1` as n independent child requests.

The engine core only knows requests that produce one sequence. A request with `n` samples becomes n
children with ids f"{index}_{parent_id}" and params n=1 (seed + index when the parent is seeded, so
the samples differ but stay reproducible). The children share the prompt, so with prefix caching on
their prompt KV blocks are shared too. `ParentRequest` decides which of the children's CompletionOutputs
go back to the user, under the parent's id; the parent is finished when every child has finished.

Output kinds, as vLLM v0.33.0: FINAL_ONLY returns all n outputs once, when the last child finishes, in
index order; DELTA and CUMULATIVE return just the output that arrived (a child's new piece, or its whole
text so far), except a late report from a child already reported finished, which returns nothing. So
with CUMULATIVE and n > 1 each RequestOutput holds ONE child's output (its `index` says which), and a
reader who wants the whole request keeps the latest output per index: `AsyncLLM`'s collector does that
for a reader who falls behind (mini/engine/output_processor.py, vLLM's `RequestOutput.add`).
"""

from __future__ import annotations

import dataclasses

from mini.engine import EngineCoreRequest
from mini.outputs import CompletionOutput
from mini.sampling_params import RequestOutputKind, SamplingParams


def child_request_id(index: int, parent_request_id: str) -> str:
    return f"{index}_{parent_request_id}"


class ParentRequest:
    """State of one parallel-sampling request: its children and their latest outputs."""

    def __init__(self, request: EngineCoreRequest) -> None:
        self.request_id = request.request_id
        self.sampling_params = request.sampling_params
        self.child_requests: set[str] = set()          # children not finished yet
        # FINAL_ONLY only: each child's last output, by index, shown together at the end (vLLM's name).
        self.output_aggregator: list[CompletionOutput | None] = (
            [None] * self.sampling_params.n if self.sampling_params.output_kind == RequestOutputKind.FINAL_ONLY
            else [])

    @property
    def n(self) -> int:
        return self.sampling_params.n

    def child_sampling_params(self, index: int) -> SamplingParams:
        params = self.sampling_params.clone()
        params.n = 1
        if params.seed is not None:
            params.seed = params.seed + index
        return params

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """Register child `index`; return its request id and sampling params."""
        child_id = child_request_id(index, self.request_id)
        self.child_requests.add(child_id)
        return child_id, self.child_sampling_params(index)

    def get_outputs(
        self, child_id: str, completion_output: CompletionOutput
    ) -> tuple[list[CompletionOutput], bool]:
        """Fold one child's new output in -> (outputs to show now, whole request finished?)."""
        already_reported_finished = False
        if completion_output.finished():
            if child_id in self.child_requests:
                self.child_requests.remove(child_id)
            else:
                already_reported_finished = True
        finished = not self.child_requests
        if self.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY:   # DELTA and CUMULATIVE
            outputs = [] if already_reported_finished else [completion_output]
        else:
            self.output_aggregator[completion_output.index] = completion_output
            outputs = [] if not finished else [o for o in self.output_aggregator if o is not None]
        return outputs, finished


def fan_out(request: EngineCoreRequest) -> tuple[ParentRequest | None, list[EngineCoreRequest]]:
    """Split a request into what the engine core runs: itself (n == 1) or n children (n > 1).

    Use: `parent, reqs = fan_out(req)`; then for each (index, child) in enumerate(reqs):
    `output_processor.add_request(child, parent, index)` and give `child` to the scheduler.
    """
    if request.sampling_params.n == 1:
        return None, [request]
    parent = ParentRequest(request)
    children = []
    for index in range(parent.n):
        child_id, child_params = parent.get_child_info(index)
        children.append(dataclasses.replace(request, request_id=child_id, sampling_params=child_params))
    return parent, children
