"""num_workers="auto" on traces recorded on this machine: the rule replays them exactly.

The traces are the windows of ``python -m scripts.bench_workers --record-trace``: each
window as the scaler measured it on a 2-core guest (exact CPU accounting, the run queue
sampled), for the four workloads of that benchmark, competing burners included.
"""

from __future__ import annotations

import itertools
import json

from reader.runtime.autoscale import Climb, WindowFigures
from tests.helpers_paths import DATA

TRACE = DATA / "autoscale_trace.json"


def recorded():
    data = json.loads(TRACE.read_text())
    for label, runs in data["traces"].items():
        for k, windows in enumerate(runs):
            yield label, k, data, [WindowFigures(**w) for w in windows]


def test_recorded_traces_replay_to_the_decisions_the_loader_made():
    # Each window as the scaler measured it (exact CPU accounting of a 2-core guest):
    # the rule, fed the same windows, must move the count exactly as it did then.
    replayed = 0
    for label, k, data, ws in recorded():
        climb = Climb(data["cores"], data["hi"])
        for i, (w, nxt) in enumerate(itertools.pairwise(ws)):
            step = climb.step(w)
            assert (step[0] if step else w.workers) == nxt.workers, (label, k, i, step)
            replayed += 1
    assert replayed > 100


def test_recorded_searches_end_within_three_windows():
    # Every search (the first, and each one the machine reopened) settles within three
    # windows of its start, and between searches the count stays where it settled.
    searches = 0
    for label, k, data, ws in recorded():
        climb = Climb(data["cores"], data["hi"])
        opened, searches = 0, searches + 1
        for i, w in enumerate(ws):
            was_settled = climb.settled is not None
            climb.step(w)
            if was_settled and climb.settled is None:
                opened, searches = i, searches + 1
            if climb.settled is None:
                assert i - opened < 3, (label, k, i, [x.workers for x in ws])
    assert searches >= 4


def test_recorded_burners_are_seen_by_the_run_queue_signal():
    for label, _, _, ws in recorded():
        if "burners" not in label:
            continue
        before = [w.contest for w in ws[: len(ws) // 4]]
        after = [w.contest for w in ws[len(ws) // 2:]]
        assert max(before) < 0.75 and min(after) >= 1.0, (before, after)
