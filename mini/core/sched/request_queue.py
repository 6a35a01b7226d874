"""Mirrors vllm/v1/core/sched/request_queue.py: the waiting queue, FCFS or by priority.

FCFS is a deque: new requests join the back, preempted ones go back to the FRONT (they were
admitted earlier). The priority queue is a heap ordered by (priority, arrival_time): a smaller
priority value is served first, ties by arrival, as in vLLM.
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
    """Min-heap on (priority, arrival_time); a preempted request simply goes back into the heap."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        # Tie-breakers so Requests are never compared: appended requests count up, prepended ones
        # count down, so among equal (priority, arrival_time) a preempted request is served first.
        self._counter = 0
        self._front_counter = 0

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, self._counter, request))
        self._counter += 1

    def prepend_request(self, request: Request) -> None:
        self._front_counter -= 1
        heapq.heappush(self._heap, (request.priority, request.arrival_time, self._front_counter, request))

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek_request() on an empty queue")
        return self._heap[0][3]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_request(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Requests in the order they would be served."""
        return (entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3]))


def create_request_queue(policy: str | SchedulingPolicy) -> FCFSRequestQueue | PriorityRequestQueue:
    if SchedulingPolicy.parse(policy) is SchedulingPolicy.PRIORITY:
        return PriorityRequestQueue()
    return FCFSRequestQueue()
