"""Which data-parallel engine core takes a new request: the least loaded one.

Why a file of its own (vLLM has none): the rule is the `data_parallel` role's part, a phase-15 exercise, so a
learner replaces it without touching the clients.

Mirrors `DPLBAsyncMPClient.get_core_engine_for_request` in vllm/v1/engine/core_client.py, fed by the load
counts of the DP coordinator (vllm/v1/engine/coordinator.py). With `data_parallel_size=N` the front end talks
to N engine cores. The coordinator collects each core's `SchedulerStats` and publishes, every ~100 ms, one
`[waiting, running]` pair per core (vLLM adds the core's KV-cache usage as a third number); the client keeps
that list (`lb_engines`) and, between two publications, its own exact count of the requests it sent to each
core that have not finished yet (`engine_inflight`).

For a new request, each core gets a score, lower is better:

    score = max(client_count * inflight, waiting + running)
          + waiting * 6 * max(0, kv_cache_usage - 0.5)        (only when the core has waiting requests)

The scan starts at `eng_start_index` and goes round the cores in order; the FIRST core with the smallest
score wins (a strict `<`), so equal scores go to the core the scan reached first. Then the client bumps the
chosen core's waiting count by `client_count` (so the next request, before the next publication, sees it)
and moves the scan start one core on, so ties rotate round the cores instead of always favouring core 0.

`get_core_engine_for_request` here is that scoring and choice as a pure function over the counts: it
returns the chosen index and changes nothing. `DPLoadBalancer` holds the state around it (the counts, the
in-flight counts, the scan start) and applies vLLM's two updates after each choice; it is the home of the
`data_parallel` role (mini/roles.py), so a DP front end built from `roles.resolve(config, DPLoadBalancer)` routes
with a replaced `get_core_engine_for_request`.

Where mini differs: vLLM's function takes the request and also honours `request.data_parallel_rank` (an
explicit rank), streaming-session affinity and pooling-request routing, and keeps `reqs_in_flight` to route
aborts; mini's DP front end does those around the call (`DPLoadBalancer.route` takes an explicit rank).
"""

from __future__ import annotations

from collections.abc import Sequence


def get_core_engine_for_request(lb_engines: Sequence[Sequence[float]], engine_inflight: Sequence[int],
                                eng_start_index: int = 0, client_count: int = 1) -> int:
    """The index of the least-loaded engine core (vLLM's scoring; see the module docstring).

    `lb_engines[i]` is core i's `[waiting, running]` or `[waiting, running, kv_cache_usage]` (usage 0..1,
    0 when absent), `engine_inflight[i]` this client's unfinished requests on core i, `eng_start_index`
    where the scan starts (ties go to the first core reached from there), `client_count` how many front-end
    clients share the cores.
    """
    num_engines = len(lb_engines)
    if num_engines == 0 or len(engine_inflight) != num_engines:
        raise ValueError(f"lb_engines and engine_inflight must be non-empty and of the same length; got "
                         f"{num_engines} and {len(engine_inflight)}")
    best_index, best_score = 0, float("inf")
    for offset in range(num_engines):
        index = (eng_start_index + offset) % num_engines
        counts = lb_engines[index]
        waiting, running = counts[0], counts[1]
        kv_cache_usage = counts[2] if len(counts) > 2 else 0.0
        score = max(client_count * engine_inflight[index], waiting + running)
        if waiting:
            score += waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)
        if score < best_score:
            best_index, best_score = index, score
    return best_index


class DPLoadBalancer:
    """The routing state of one front end over `num_engines` data-parallel cores (vLLM's DPLBAsyncMPClient)."""

    get_core_engine_for_request = staticmethod(get_core_engine_for_request)

    def __init__(self, num_engines: int, client_count: int = 1, client_index: int = 0) -> None:
        if not isinstance(num_engines, int) or num_engines < 1:
            raise ValueError(f"num_engines must be a positive int, got {num_engines!r}")
        if not isinstance(client_count, int) or client_count < 1 or not 0 <= client_index < client_count:
            raise ValueError(f"client_index must be in [0, client_count); got client_index={client_index!r}, "
                             f"client_count={client_count!r}")
        self.client_count = client_count
        self.lb_engines: list[list[float]] = [[0, 0, 0.0] for _ in range(num_engines)]
        self.engine_inflight: list[int] = [0] * num_engines
        self.eng_start_index = (num_engines * client_index) // client_count
        self.reqs_in_flight: dict[str, int] = {}

    def update_counts(self, counts: Sequence[Sequence[float]]) -> None:
        """A new publication of the cores' `[waiting, running(, kv_cache_usage)]` (the coordinator's)."""
        if len(counts) != len(self.lb_engines):
            raise ValueError(f"counts must have one entry per engine ({len(self.lb_engines)}), got {len(counts)}")
        self.lb_engines = [[c[0], c[1], c[2] if len(c) > 2 else 0.0] for c in counts]

    def route(self, request_id: str, data_parallel_rank: int | None = None) -> int:
        """The core that takes `request_id`: `data_parallel_rank` when given, else the least loaded."""
        num_engines = len(self.lb_engines)
        if data_parallel_rank is not None:
            if not isinstance(data_parallel_rank, int) or not 0 <= data_parallel_rank < num_engines:
                raise ValueError(f"data_parallel_rank must be in [0, {num_engines}), got {data_parallel_rank!r}")
            index = data_parallel_rank
        else:
            index = int(self.get_core_engine_for_request(self.lb_engines, self.engine_inflight,
                                                         self.eng_start_index, self.client_count))
            if not 0 <= index < num_engines:
                raise ValueError(f"get_core_engine_for_request returned {index!r}, not an index in "
                                 f"[0, {num_engines})")
            self.lb_engines[index][0] += self.client_count     # counted as waiting until the next publication
            self.eng_start_index = (self.eng_start_index + 1) % num_engines
        self.reqs_in_flight[request_id] = index
        self.engine_inflight[index] += 1
        return index

    def finished(self, request_ids: Sequence[str]) -> None:
        """Requests that finished (or were aborted): no longer in flight on their core."""
        for request_id in request_ids:
            index = self.reqs_in_flight.pop(request_id, None)
            if index is not None:
                self.engine_inflight[index] -= 1


__all__ = ["DPLoadBalancer", "get_core_engine_for_request"]
