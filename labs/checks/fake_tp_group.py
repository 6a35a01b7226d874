"""A fake tensor-parallel group: N ranks simulated in one process, one thread per rank.

The phase-15 checks run a learner's parallel layer on every rank without starting processes or a
torch.distributed group: `run_ranks(world_size, fn)` calls `fn(rank)` on N threads, and while they run,
mini's collectives (mini/distributed/communication_op.py: `tensor_model_parallel_all_reduce`,
`..._all_gather`, `..._gather`) meet at a barrier and combine the ranks' tensors in rank order, exactly as
gloo would (the sum is taken in rank order, so results are deterministic). Each rank's calls are counted,
so a check can say "rank 1 called all_reduce twice, the reference once".

How: inside `run_ranks`, `mini.distributed.parallel_state._TP` is a fake group whose `rank` is the calling
thread's, and `communication_op.dist` is this module's `_FakeDist`; both are put back afterwards (the checks
run one at a time; no engine runs meanwhile). A rank that raises, or returns while another waits in a
collective it never called, ends that wait with `CollectiveMismatch`, so no thread hangs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from mini.distributed import communication_op, parallel_state

BARRIER_TIMEOUT_S = 30.0


class CollectiveMismatch(AssertionError):
    """The ranks did not call the same collectives (one waited for a partner that never came)."""


class _ReduceOp:
    SUM = "sum"


class _FakeState:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.cond = threading.Condition()
        self.entered = [0] * world_size            # collectives each rank has entered so far
        self.done = [False] * world_size           # ranks that returned (or raised)
        self.slots: dict[int, list[Any]] = {}      # the n-th collective -> each rank's tensor
        self.local = threading.local()
        self.calls: list[Counter] = [Counter() for _ in range(world_size)]

    @property
    def rank(self) -> int:
        return self.local.rank

    def exchange(self, name: str, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `tensor` (a copy), in rank order, once all ranks got to this collective."""
        rank, size = self.rank, self.world_size
        self.calls[rank][name] += 1
        with self.cond:
            index = self.entered[rank]
            self.entered[rank] += 1
            slots = self.slots.setdefault(index, [None] * size)
            slots[rank] = (name, tensor.detach().clone())
            self.cond.notify_all()

            def settled() -> bool:
                return all(slot is not None for slot in slots) or any(
                    self.done[r] and self.entered[r] <= index for r in range(size))

            self.cond.wait_for(settled, timeout=BARRIER_TIMEOUT_S)
            if not all(slot is not None for slot in slots):
                missing = [r for r in range(size) if slots[r] is None]
                raise CollectiveMismatch(
                    f"rank {rank} waited in {name} (its collective #{index + 1}) for rank(s) {missing}, which "
                    f"never called it (or raised): every rank must call the same collectives in the same order")
        names = sorted({slot[0] for slot in slots})
        if len(names) > 1:
            raise CollectiveMismatch(f"collective #{index + 1}: the ranks called different collectives {names}")
        return [slot[1] for slot in slots]

    def leave(self, rank: int) -> None:
        with self.cond:
            self.done[rank] = True
            self.cond.notify_all()


class _FakeGroup:
    """Stands in for `parallel_state._TensorParallelGroup`: `rank` is the calling thread's."""

    def __init__(self, state: _FakeState) -> None:
        self._state = state
        self.world_size = state.world_size
        self.backend = "fake"
        self.device = torch.device("cpu")
        self.group = "fake-group"

    @property
    def rank(self) -> int:
        return self._state.rank


class _FakeDist:
    """The few `torch.distributed` functions communication_op.py calls, over the fake group."""

    ReduceOp = _ReduceOp

    def __init__(self, state: _FakeState) -> None:
        self._state = state

    def all_reduce(self, tensor: torch.Tensor, op: Any = _ReduceOp.SUM, group: Any = None) -> None:
        pieces = self._state.exchange("all_reduce", tensor)
        total = pieces[0].clone()
        for piece in pieces[1:]:
            total += piece
        with torch.no_grad():
            tensor.copy_(total)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None) -> None:
        pieces = self._state.exchange("all_gather", tensor)
        with torch.no_grad():
            for out, piece in zip(tensor_list, pieces, strict=True):
                out.copy_(piece)

    def gather(self, tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0,
               group: Any = None) -> None:
        pieces = self._state.exchange("gather", tensor)
        if gather_list is not None:
            with torch.no_grad():
                for out, piece in zip(gather_list, pieces, strict=True):
                    out.copy_(piece)


_RUN_LOCK = threading.Lock()


def run_ranks(world_size: int, fn: Callable[[int], Any]) -> tuple[list[Any], list[dict[str, int]]]:
    """`[fn(0), ..., fn(world_size - 1)]`, each on its own thread inside the fake group, and each rank's
    collective call counts. The first error (in rank order, a learner's error before a broken barrier) is
    re-raised here, in the caller's thread, with its traceback."""
    state = _FakeState(world_size)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def target(rank: int) -> None:
        state.local.rank = rank
        try:
            results[rank] = fn(rank)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            errors[rank] = error
        finally:
            state.leave(rank)   # a partner still waiting in a collective will never be joined

    with _RUN_LOCK:
        saved_group, saved_dist = parallel_state._TP, communication_op.dist
        parallel_state._TP = _FakeGroup(state)
        communication_op.dist = _FakeDist(state)
        try:
            threads = [threading.Thread(target=target, args=(rank,), name=f"fake-tp-rank-{rank}", daemon=True)
                       for rank in range(world_size)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(BARRIER_TIMEOUT_S * 2)
        finally:
            parallel_state._TP, communication_op.dist = saved_group, saved_dist
    first = [e for e in errors if e is not None and not isinstance(e, CollectiveMismatch)]
    first = first or [e for e in errors if e is not None]
    if first:
        raise first[0]
    return results, [dict(counter) for counter in state.calls]


__all__ = ["CollectiveMismatch", "run_ranks"]
