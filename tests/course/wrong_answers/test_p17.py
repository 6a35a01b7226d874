"""Phase 17's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

LENGTHS_FIRST = '''
def first_divergence(expected, got):
    for index, (want, have) in enumerate(zip(expected, got)):
        if len(want) != len(have):
            return index, min(len(want), len(have))
        for position, (a, b) in enumerate(zip(want, have)):
            if a != b:
                return index, position
    return None
'''

SKIPS_ONLY_DROPPED = '''
def phase_scores(results):
    scores = {}
    for result in results:
        if result.outcome == "skipped":
            continue
        earned, possible = scores.get(result.phase, (0, 0))
        possible += result.points
        if result.outcome == "passed":
            earned += result.points
        scores[result.phase] = (earned, possible)
    return scores
'''

LINEAR_SCAN = '''
def find_breaking_component(components, is_exact):
    if not components or is_exact(list(components)):
        return None
    for name in components:
        if not is_exact([name]):
            return name
    return None
'''

NO_WHOLE_SET_QUESTION = '''
def find_breaking_component(components, is_exact):
    suspects = list(components)
    if not suspects:
        return None
    while len(suspects) > 1:
        half = suspects[: len(suspects) // 2]
        suspects = half if not is_exact(half) else suspects[len(half):]
    return suspects[0]
'''

SORTED_PHASES = '''
def phase_scores(results):
    scores = {}
    for result in results:
        earned, possible = scores.get(result.phase, (0, 0))
        if result.outcome != "skipped":
            possible += result.points
            if result.outcome == "passed":
                earned += result.points
        scores[result.phase] = (earned, possible)
    return dict(sorted(scores.items()))
'''

LAST_DIFFERENCE = '''
def first_divergence(expected, got):
    where = None
    for index, (want, have) in enumerate(zip(expected, got)):
        for position, (a, b) in enumerate(zip(want, have)):
            if a != b:
                where = (index, position)
        if where is None and len(want) != len(have):
            where = (index, min(len(want), len(have)))
    return where
'''

PADS_IN_PLACE = '''
def first_divergence(expected, got):
    for index, (want, have) in enumerate(zip(expected, got)):
        length = max(len(want), len(have))
        want += [None] * (length - len(want))
        have += [None] * (length - len(have))
        for position, (a, b) in enumerate(zip(want, have)):
            if a != b:
                return index, position
    return None
'''

ASKS_BOTH_HALVES = '''
def find_breaking_component(components, is_exact):
    suspects = list(components)
    if not suspects or is_exact(suspects):
        return None
    while len(suspects) > 1:
        half = len(suspects) // 2
        left, right = suspects[:half], suspects[half:]
        left_exact, right_exact = is_exact(left), is_exact(right)
        suspects = right if left_exact else left
    return suspects[0]
'''

CONFIRMS_THE_LAST_SUSPECT = '''
def find_breaking_component(components, is_exact):
    suspects = list(components)
    if not suspects or is_exact(suspects):
        return None
    while len(suspects) > 1:
        half = suspects[: len(suspects) // 2]
        suspects = half if not is_exact(half) else suspects[len(half):]
    return suspects[0] if not is_exact(suspects) else None
'''

COUNTS_RESULTS = '''
def phase_scores(results):
    scores = {}
    for result in results:
        earned, possible = scores.get(result.phase, (0, 0))
        if result.outcome != "skipped":
            possible += 1
            if result.outcome == "passed":
                earned += 1
        scores[result.phase] = (earned, possible)
    return scores
'''

WRONG = [
    # first_divergence
    Wrong("first_divergence", "a prefix counts as equal",
          edit=("        if len(want) != len(have):\n            return index, min(len(want), len(have))\n", ""),
          expect="the length of the shorter one"),
    Wrong("first_divergence", "the longer length as the position",
          edit=("return index, min(len(want), len(have))", "return index, max(len(want), len(have))"),
          expect="the length of the shorter one"),
    Wrong("first_divergence", "token position and prompt index swapped",
          edit=("                return index, position", "                return position, index"),
          expect="(prompt index, token position)"),
    Wrong("first_divergence", "lengths compared before the tokens", source=LENGTHS_FIRST,
          expect="the first token position where the two lists differ"),
    Wrong("first_divergence", "token positions counted from 1", expect="count from 0",
          edit=("enumerate(zip(want, have))", "enumerate(zip(want, have), start=1)")),
    Wrong("first_divergence", "the last difference instead of the first", source=LAST_DIFFERENCE,
          expect="is a LATER difference"),
    Wrong("first_divergence", "pads the shorter run in place to compare", source=PADS_IN_PLACE,
          expect="the arguments after the call"),
    # find_breaking_component
    Wrong("find_breaking_component", "one component at a time", source=LINEAR_SCAN,
          expect="halve the suspects"),
    Wrong("find_breaking_component", "never asks about the whole set", source=NO_WHOLE_SET_QUESTION,
          expect="first ask about the whole set"),
    Wrong("find_breaking_component", "keeps the exact half",
          edit=("suspects = half if not is_exact(half) else suspects[len(half):]",
                "suspects = half if is_exact(half) else suspects[len(half):]"),
          expect="keep the half that is still not exact"),
    Wrong("find_breaking_component", "loops until no suspect is left (never ends)",
          edit=("    while len(suspects) > 1:", "    while len(suspects) > 0:"),
          expect="the suspects stopped shrinking"),
    Wrong("find_breaking_component", "asks about both halves every round", source=ASKS_BOTH_HALVES,
          expect="ask no question whose answer you already know"),
    Wrong("find_breaking_component", "confirms the last suspect with one more call", source=CONFIRMS_THE_LAST_SUSPECT,
          expect="over the budget"),
    Wrong("find_breaking_component", "asks about a name, not a list of names",
          edit=("    return suspects[0]", "    return suspects[0] if not is_exact(suspects[0]) else None"),
          expect="pass a LIST of component names"),
    # phase_scores
    Wrong("phase_scores", "skipped counted as possible",
          edit=('        if result.outcome != "skipped":\n            possible += result.points\n            if',
                '        possible += result.points\n        if True:\n            if'),
          expect="skipped counts toward neither"),
    Wrong("phase_scores", "phases sorted by name", source=SORTED_PHASES, expect="in order of first appearance"),
    Wrong("phase_scores", "failed results earn their points",
          edit=('if result.outcome == "passed":', 'if result.outcome != "not implemented":'),
          expect="passed earns its points, other outcomes 0"),
    Wrong("phase_scores", "a phase of skips left out", source=SKIPS_ONLY_DROPPED,
          expect="even one whose results are all skipped: (0, 0)"),
    Wrong("phase_scores", "counts results instead of points", source=COUNTS_RESULTS, expect="counts its POINTS"),
    Wrong("phase_scores", "pop instead of get: a phase moves to the end", expect="in order of first appearance",
          edit=("scores.get(result.phase, (0, 0))", "scores.pop(result.phase, (0, 0))")),
    Wrong("phase_scores", "not implemented left out of the possible points",
          edit=('        if result.outcome != "skipped":', '        if result.outcome in ("passed", "failed"):'),
          expect="every outcome but skipped counts"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("17_capstone", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
