"""Data-parallel routing (mini/engine/dp_routing.py): vLLM's least-loaded choice as a pure function, the
balancer's updates around it, bad input refused, and the choice replaceable as the `data_parallel` role's part."""

from __future__ import annotations

import pytest

from mini import roles
from mini.config import EngineConfig
from mini.engine.dp_routing import DPLoadBalancer, get_core_engine_for_request


@pytest.mark.parametrize(("counts", "inflight", "start", "clients", "chosen"), [
    ([[0, 0], [0, 0]], [0, 0], 0, 1, 0),
    ([[0, 0], [0, 0]], [0, 0], 1, 1, 1),               # a tie: the first core the scan reaches
    ([[3, 1], [0, 2], [1, 0]], [0, 0, 0], 0, 1, 2),    # waiting + running
    ([[0, 0], [0, 0], [0, 0]], [2, 0, 1], 0, 1, 1),    # this client's in-flight requests are a floor
    ([[0, 1], [0, 0]], [0, 1], 0, 2, 0),               # ... scaled by the number of clients: 1 < 2
    ([[2, 0, 0.9], [0, 3, 0.2]], [0, 0], 0, 1, 1),     # KV pressure: 2 + 2 * 6 * 0.4 > 3
    ([[2, 0, 0.4], [0, 3, 0.2]], [0, 0], 0, 1, 0),     # no penalty at or below half usage
])
def test_least_loaded_choice(counts, inflight, start, clients, chosen):
    before = [list(c) for c in counts], list(inflight)
    assert get_core_engine_for_request(counts, inflight, start, clients) == chosen
    assert ([list(c) for c in counts], list(inflight)) == before   # a pure choice


def test_the_balancer_spreads_a_burst_round_robin_and_follows_finished_requests():
    balancer = DPLoadBalancer(3)
    assert [balancer.route(f"r{i}") for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert balancer.engine_inflight == [2, 2, 2] and balancer.lb_engines[0][0] == 2
    balancer.finished(["r1", "r4", "unknown"])
    balancer.update_counts([[0, 2], [0, 0], [0, 2]])
    assert balancer.route("next") == 1                       # the core whose requests finished
    assert balancer.route("pinned", data_parallel_rank=2) == 2 and balancer.engine_inflight == [2, 1, 3]


def test_two_clients_start_their_scans_apart():
    assert DPLoadBalancer(4, client_count=2, client_index=1).route("r") == 2


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_engines": 0}, "num_engines"), ({"num_engines": 2, "client_index": 2, "client_count": 2}, "client_index"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPLoadBalancer(**kwargs)


def test_bad_calls_are_refused_before_any_state_changes():
    balancer = DPLoadBalancer(2)
    with pytest.raises(ValueError, match="data_parallel_rank"):
        balancer.route("r", data_parallel_rank=5)
    with pytest.raises(ValueError, match="one entry per engine"):
        balancer.update_counts([[0, 0]])
    with pytest.raises(ValueError, match="same length"):
        get_core_engine_for_request([[0, 0]], [0, 0])
    assert balancer.engine_inflight == [0, 0] and balancer.reqs_in_flight == {}


def test_the_choice_is_a_part_of_the_data_parallel_role():
    assert roles.role_of("get_core_engine_for_request").name == "data_parallel"
    assert roles.reference("get_core_engine_for_request") is get_core_engine_for_request

    def always_last(lb_engines, engine_inflight, eng_start_index=0, client_count=1):
        return len(lb_engines) - 1

    with roles.use(get_core_engine_for_request=always_last):
        balancer = roles.resolve(roles.with_pending(EngineConfig()), DPLoadBalancer)(3)
    assert [balancer.route(f"r{i}") for i in range(3)] == [2, 2, 2]
    assert DPLoadBalancer(3).route("r") == 0

    bad = roles.with_parts(DPLoadBalancer, {"get_core_engine_for_request": lambda *args: 7})(2)
    with pytest.raises(ValueError, match="not an index"):
        bad.route("r")
