"""Phase 02 lab: grades the answer cells of 02_slot_mapping.ipynb (one test per exercise)."""

from __future__ import annotations

from labs.checks import p02

NOTEBOOK = "02_slot_mapping"


def test_compute_query_start_loc(answers):
    p02.check_query_start_loc(answers(NOTEBOOK).get("compute_query_start_loc"))


def test_compute_positions(answers):
    p02.check_positions(answers(NOTEBOOK).get("compute_positions"))


def test_compute_slot_mapping(answers):
    p02.check_slot_mapping(answers(NOTEBOOK).get("compute_slot_mapping"))


def test_prepare_inputs(answers):
    p02.check_prepare_inputs(answers(NOTEBOOK).get("prepare_inputs"))
