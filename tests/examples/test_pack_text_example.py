"""``scripts/pack_text_example.py``: the agreed schema, byte-level tokens, a path printed last."""

from __future__ import annotations

import numpy as np

import formats
from scripts import pack_text_example as ex


def test_it_packs_documents_with_byte_tokens_and_prints_the_folder(tmp_path, capsys):
    out = tmp_path / "text.shards"
    assert ex.main(["--out", str(out), "--docs", "40", "--workers", "2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    ds = formats.open_shards(out)
    assert [(f.name, f.type, f.dtype, f.shape) for f in ds.fields] == [
        ("text", "str", None, None), ("tokens", "ndarray", "<i4", (None,))]
    assert len(ds) == 40
    for i in (0, 39):
        text, tokens = ds[i]["text"], ds[i]["tokens"]
        assert text == ex.document(i)
        assert tokens[-1] == ex.EOD and (tokens[:-1] < 256).all()
        assert bytes(tokens[:-1].astype(np.uint8)).decode("utf-8") == text
    assert int(max(ds[i]["tokens"].max() for i in range(len(ds)))) == ex.VOCAB_SIZE - 1
    # Again without --overwrite: found in --out, so one line and status 1, no traceback.
    assert ex.main(["--out", str(out), "--docs", "40", "--workers", "0"]) == 1
    assert "already a dataset" in capsys.readouterr().err


def test_the_corpus_is_deterministic_and_not_ascii_only():
    assert ex.document(7) == ex.document(7) != ex.document(8)
    assert any(max(ex.document(i)) > "\x7f" for i in range(50))  # 'café', 'naïve': 2-byte UTF-8
