"""Mirrors vllm/v1/core/sched/request_queue.py: the waiting queue, FCFS or by priority.

FCFS is a deque: new requests join the back, preempted ones go back to the FRONT (they were
admitted earlier). The priority queue is a heap ordered by (priority, arrival_time, request_id): a
smaller priority value is served first, ties by arrival, then by request id, as vLLM's `Request.__lt__`
(vllm/v1/request.py); "prepending" a preempted request is a plain push there.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Iterator

from mini.core.request import Request


class SchedulingPolicy(enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"

    @classmethod
    def parse(cls, value: str | SchedulingPolicy) -> SchedulingPolicy:
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = tuple(policy.value for policy in cls)
            raise ValueError(f"scheduling_policy must be one of {allowed}, got {value!r}") from None


class FCFSRequestQueue:
    """First come, first served."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek_request(self) -> Request:
        if not self._queue:
            raise IndexError("peek_request() on an empty queue")
        return self._queue[0]

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def remove_request(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue:
    """Min-heap on (priority, arrival_time, request_id); a preempted request simply goes back into the heap."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, int, Request]] = []
        # The last tie-breaker (never reached: request ids are unique) keeps Requests from being compared.
        self._counter = 0

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, request.request_id, self._counter,
                                    request))
        self._counter += 1

    def prepend_request(self, request: Request) -> None:
        """No front in a priority queue (as vLLM): the request goes back by its (priority, arrival_time)."""
        self.add_request(request)

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek_request() on an empty queue")
        return self._heap[0][-1]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove_request(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[-1] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Requests in the order they would be served."""
        return (entry[-1] for entry in sorted(self._heap, key=lambda entry: entry[:-1]))


def create_request_queue(policy: str | SchedulingPolicy) -> FCFSRequestQueue | PriorityRequestQueue:
    if SchedulingPolicy.parse(policy) is SchedulingPolicy.PRIORITY:
        return PriorityRequestQueue()
    return FCFSRequestQueue()
