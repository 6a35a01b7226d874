"""The scheduler role (mini/roles.py): its parts are class attributes of `Scheduler`, called through `self.`,
chosen once when the scheduler's class is resolved; and the usable-block count is one property."""

from __future__ import annotations

import pathlib

import pytest

from labs.checks.p05 import fake_model_output, worked_workload
from mini import roles
from mini.config import EngineConfig
from mini.core.block_pool import BlockPool, usable_blocks
from mini.core.kv_cache_manager import KVCacheManager
from mini.core.request import Request
from mini.core.sched import scheduler as sched
from mini.core.sched import utils as sched_utils
from mini.core.sched.scheduler import Scheduler
from mini.sampling_params import SamplingParams

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

SCHEDULER_PARTS = ("schedule", "num_tokens_to_schedule", "select_preemption_victim", "check_stop")


def build(scheduler_class: type[Scheduler]) -> Scheduler:
    config, _ = worked_workload()
    engine_config = EngineConfig(**{k: v for k, v in config.items() if k != "num_gpu_blocks"})
    manager = KVCacheManager(config["num_gpu_blocks"], config["block_size"], config["enable_prefix_caching"])
    return scheduler_class(engine_config, manager)


def run_worked_example(scheduler: Scheduler) -> list[tuple[dict[str, int], list[tuple[str, list[int], str | None]]]]:
    """Every step's scheduled tokens and outputs, to the end of the phase-05 worked example."""
    _, specs = worked_workload()
    for spec in specs:
        scheduler.add_request(Request(spec["id"], spec["prompt"], SamplingParams(max_tokens=spec["max_tokens"],
                                                                                 ignore_eos=True)))
    log = []
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        outputs = scheduler.update_from_output(output, fake_model_output(scheduler, output))
        log.append((dict(output.num_scheduled_tokens),
                    [(o.request_id, list(o.new_token_ids), o.finish_reason) for o in outputs]))
    return log


def counting(function, calls: list[str], name: str):
    def counted(*args, **kwargs):
        calls.append(name)
        return function(*args, **kwargs)
    return counted


def test_the_scheduler_role_lives_on_the_scheduler_and_references_the_module_functions():
    assert roles.role_of("schedule").name == "scheduler"
    assert {part: roles.home_class(part) for part in SCHEDULER_PARTS} == dict.fromkeys(SCHEDULER_PARTS, Scheduler)
    assert roles.reference("num_tokens_to_schedule") is sched.num_tokens_to_schedule
    assert roles.reference("select_preemption_victim") is sched.select_preemption_victim
    assert roles.reference("check_stop") is sched_utils.check_stop
    assert roles.reference("schedule") is Scheduler.schedule
    assert roles.resolve(EngineConfig(), Scheduler) is Scheduler


def test_a_scheduler_built_with_other_parts_calls_them_through_self_and_the_default_is_untouched():
    calls: list[str] = []
    parts = {name: counting(roles.reference(name), calls, name) for name in SCHEDULER_PARTS}
    chosen = roles.resolve(EngineConfig(parts=parts), Scheduler)
    assert chosen.__bases__ == (Scheduler,) and all(getattr(chosen, name) is not getattr(Scheduler, name)
                                                    for name in SCHEDULER_PARTS)

    expected = run_worked_example(build(Scheduler))
    assert calls == []  # the default class never sees the replacements
    assert run_worked_example(build(chosen)) == expected
    assert {"schedule", "num_tokens_to_schedule", "select_preemption_victim", "check_stop"} <= set(calls)
    assert Scheduler.num_tokens_to_schedule is sched.num_tokens_to_schedule  # still the reference


def test_a_replaced_check_stop_decides_when_requests_stop():
    def stop_after_two(request, max_model_len):
        if request.num_output_tokens >= 2:
            request.status = sched_utils.RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    log = run_worked_example(build(roles.resolve(EngineConfig(parts={"check_stop": stop_after_two}), Scheduler)))
    finished = {rid: reason for _, outputs in log for rid, _, reason in outputs if reason is not None}
    emitted: dict[str, int] = {}
    for _, outputs in log:
        for rid, tokens, _ in outputs:
            emitted[rid] = emitted.get(rid, 0) + len(tokens)
    assert set(finished.values()) == {"length"} and set(emitted.values()) == {2}


def test_no_seam_is_left_in_the_core():
    core = pathlib.Path(sched.__file__).parents[1]
    assert not [str(path) for path in core.rglob("*.py") if "seam" in path.read_text()]


def test_the_usable_block_count_is_one_property():
    pool = BlockPool(8)
    assert usable_blocks(8) == pool.num_usable_blocks == pool.get_num_free_blocks() == 7
    pool.get_new_blocks(7)
    assert pool.get_usage() == 1.0
    manager = KVCacheManager(8, 4)
    assert manager.num_usable_tokens == 28
    scheduler = Scheduler(EngineConfig(max_model_len=1024), manager)
    assert scheduler.max_request_len == 28
