"""The LM example trains on token blocks and resumes exactly (skipped without torch)."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("torch", reason="the example trainer needs PyTorch")

from formats import DatasetWriter, Field
from scripts.train_lm_example import main


def _corpus(root):
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "red", "house"]
    fields = [Field("text", "str"), Field("tokens", "ndarray", dtype="int32", shape=(None,))]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=100) as w:
        for _ in range(300):
            text = " ".join(rng.choice(words, rng.integers(5, 20))) + "."
            ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
            w.write({"text": text, "tokens": np.append(ids, 256).astype(np.int32)})


def test_trains_and_resumes_exactly(tmp_path, capsys):
    data, ckpt = tmp_path / "text", tmp_path / "lm.pt"
    _corpus(data)
    common = ["--data", str(data), "--block-size", "32", "--batch-size", "8", "--dim", "32",
              "--layers", "1", "--log-every", "10", "--checkpoint", str(ckpt)]
    assert main([*common, "--steps", "40", "--save-every", "1000"]) == 0
    whole = capsys.readouterr().out
    assert main([*common, "--steps", "20"]) == 0  # saved at the end of the run
    capsys.readouterr()
    assert main([*common, "--steps", "40", "--save-every", "1000", "--resume", str(ckpt)]) == 0
    resumed = capsys.readouterr().out
    assert "resumed at step 20" in resumed
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", whole)]
    assert losses[-1] < losses[0] < 5.6  # it learns (a uniform guess is ln 257 = 5.55)
    # The same batches after the resume as in the uninterrupted run: the same losses.
    assert re.findall(r"step +40 .*loss (\d+\.\d+)", resumed) == \
        re.findall(r"step +40 .*loss (\d+\.\d+)", whole)


def test_a_checkpoint_it_cannot_resume_from_is_one_line(tmp_path, capsys):
    data, ckpt = tmp_path / "text", tmp_path / "lm.pt"
    _corpus(data)
    common = ["--data", str(data), "--block-size", "16", "--batch-size", "4", "--dim", "16",
              "--layers", "1", "--steps", "2"]
    assert main([*common, "--resume", str(ckpt)]) == 1
    assert capsys.readouterr().err == (f"train_lm_example: error: {ckpt}: the --resume "
                                       "checkpoint does not exist\n")
    ckpt.write_bytes(b"not a checkpoint")
    assert main([*common, "--resume", str(ckpt)]) == 1
    assert "cannot resume from this checkpoint" in capsys.readouterr().err
    assert main([*common, "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    # Saved by a run of another model size: said, naming the file, not a traceback.
    assert main([*common[:-6], "--dim", "32", "--layers", "1", "--steps", "4",
                 "--resume", str(ckpt)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"train_lm_example: error: {ckpt}: cannot resume") and "size" in err
