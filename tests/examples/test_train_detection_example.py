"""The detection example packs its data, learns, and resumes exactly where it stopped
(skipped without torch)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch", reason="the detection example trains with PyTorch")

from scripts.train_detection_example import main


def _losses(out: str) -> dict[int, str]:
    return {int(s): loss for s, loss in re.findall(r"step +(\d+) .*loss (\d+\.\d+)", out)}


def test_trains_and_resumes_exactly(tmp_path, capsys):
    data, ckpt = tmp_path / "det", tmp_path / "ckpt.pt"
    common = ["--data", str(data), "--images", "48", "--held-out", "8", "--min-side", "64",
              "--max-side", "96", "--short", "64", "80", "--max-size", "128",
              "--batch-size", "8", "--workers", "1", "--log-every", "1"]
    assert main([*common, "--make-data", "--steps", "16"]) == 0
    straight = capsys.readouterr().out
    assert (data / "train" / "manifest.json").exists() and (data / "held_out" / "manifest.json").exists()
    assert "done: 16 steps" in straight

    # Fewer steps than --save-every (100 by default): saved at the end of the run.
    assert main([*common, "--steps", "8", "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    assert ckpt.exists()
    assert main([*common, "--steps", "16", "--resume", str(ckpt)]) == 0
    resumed = capsys.readouterr().out
    assert re.search(r"resumed at step 8, epoch \d+, batch \d+", resumed), resumed

    # The same batches into the same model and optimizer state: the same losses, to the
    # last printed digit, as the run that never stopped.
    a, b = _losses(straight), _losses(resumed)
    assert sorted(b) == list(range(9, 17))
    assert [b[s] for s in range(9, 17)] == [a[s] for s in range(9, 17)]
    first, last = (sum(float(a[s]) for s in steps) / 4 for steps in (range(1, 5), range(13, 17)))
    assert last < first  # it learns

    m = re.search(r"recall (\d\.\d+) precision (\d\.\d+) \(untrained: recall (\d\.\d+)", straight)
    assert m, straight
    assert all(0 <= float(x) <= 1 for x in m.groups())


def test_a_missing_resume_checkpoint_is_one_line(tmp_path, capsys):
    ckpt = tmp_path / "det.pt"
    assert main(["--data", str(tmp_path / "det"), "--make-data", "--resume", str(ckpt)]) == 1
    assert capsys.readouterr().err == (f"train_detection_example: error: {ckpt}: the --resume "
                                       "checkpoint does not exist\n")
    assert not (tmp_path / "det").exists()  # refused before --make-data
