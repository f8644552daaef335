"""scripts/training.py: the example trainers' shared setup and loop."""

from __future__ import annotations

import argparse

import pytest

from scripts import training


class Batches:
    """A reader of three batches an epoch that says when it is closed."""

    def __init__(self):
        self.epoch, self.closed = 0, False

    def __iter__(self):
        for i in range(3):
            yield (self.epoch, i)
        self.epoch += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True


def _args(*argv):
    p = argparse.ArgumentParser()
    training.add_arguments(p, batch_size=8, log_every=2)
    return p, p.parse_args(list(argv))


def test_the_loop_runs_epoch_after_epoch_to_the_step_count_and_logs_on_time():
    _, args = _args("--steps", "7")
    reader, fitted, logged = Batches(), [], []
    step = training.train(args, reader, "r", None, None, 0, fitted.append, logged.append)
    assert step == 7 and reader.closed
    assert fitted == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0)]
    assert logged == [2, 4, 6]
    # A resumed run starts at its step and stops at the same total.
    fitted.clear()
    assert training.train(args, Batches(), "r", None, None, 5, fitted.append, print) == 7
    assert len(fitted) == 2


def test_workers_is_a_number_or_auto(capsys):
    p, args = _args()
    assert args.workers == "auto" and p.parse_args(["--workers", "3"]).workers == 3
    with pytest.raises(SystemExit) as info:
        p.parse_args(["--workers", "two"])
    assert info.value.code == 2 and "a number or auto, not 'two'" in capsys.readouterr().err


def test_run_gives_the_body_checked_arguments_or_says_why_not(tmp_path, capsys):
    pytest.importorskip("torch", reason="run() imports PyTorch")
    p, _ = _args()
    assert training.run(p, ["--steps", "3"], "t", lambda a, torch: a.steps) == 3
    missing = ["--resume", str(tmp_path / "nope.pt")]
    assert training.run(p, missing, "t", lambda a, torch: 0) == 1
    assert "t: error:" in capsys.readouterr().err
