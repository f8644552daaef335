"""The example trainer runs, learns, and resumes from its checkpoint (skipped without torch)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch", reason="the example trainer needs PyTorch")

from scripts.train_example import main


def test_trains_and_resumes(tmp_path, capsys):
    data, ckpt = tmp_path / "toy", tmp_path / "ckpt.pt"
    common = ["--data", str(data), "--records", "128", "--batch-size", "16", "--workers", "1",
              "--size", "24", "--log-every", "20", "--checkpoint", str(ckpt)]
    assert main([*common, "--make-data", "--steps", "40"]) == 0
    first = capsys.readouterr().out
    # Fewer steps than --save-every (100 by default): saved at the end of the run.
    assert ckpt.exists() and "done: 40 steps" in first
    assert main([*common, "--steps", "80", "--resume", str(ckpt)]) == 0
    second = capsys.readouterr().out
    # Saved right after the last batch of epoch 4 (8 batches per epoch): the next unseen
    # batch is epoch 5's first.
    assert re.search(r"resumed at step 40, epoch 5, batch 0", second), second
    assert "done: 80 steps" in second
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", first + second)]
    assert losses[-1] < losses[0]  # it learns: the colour of a square gives the class
    # The ledger: 80 steps straight served exactly what 40, a checkpoint and 40 more did.
    straight = common[:common.index("--checkpoint")]
    assert main([*straight, "--steps", "80", "--workers", "0"]) == 0
    third = capsys.readouterr().out
    ledger = re.compile(r"ledger: ([0-9a-f]{32}) after 80 batches")
    assert ledger.search(second) and ledger.search(third)
    assert ledger.search(second).group(1) == ledger.search(third).group(1)


def test_checkpoint_options_are_checked_before_anything_starts(tmp_path, capsys):
    data = tmp_path / "toy"
    missing = ["--data", str(data), "--make-data", "--resume", str(tmp_path / "no.pt")]
    assert main(missing) == 1
    err = capsys.readouterr().err
    assert err == f"train_example: error: {tmp_path / 'no.pt'}: the --resume checkpoint does not exist\n"
    assert main([*missing[:3], "--resume", str(tmp_path)]) == 1
    assert "the --resume checkpoint is not a file" in capsys.readouterr().err
    assert not data.exists()  # refused before --make-data
    with pytest.raises(SystemExit) as info:
        main(["--data", str(data), "--save-every", "5"])
    assert info.value.code == 2 and "--save-every needs --checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--data", str(data), "--checkpoint", str(tmp_path / "c.pt"), "--save-every", "0"])
    assert info.value.code == 2 and "at least 1, not 0" in capsys.readouterr().err
