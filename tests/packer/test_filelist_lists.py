"""File-list columns of lists: ndarray or json, typed on the whole list, or as --field says."""

from __future__ import annotations

import json

import numpy as np
import pytest

import formats
from formats.errors import InputError
from packer import PackInputError, PackOptions, UsageError, pack
from packer.cli import main
from tests.helpers_packer import jpeg


def opts(**kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, **kw})


def jsonl(tmp_path, rng, columns: dict[str, list]) -> object:
    """A JSONL list of len(values) rows, one image each, with these columns."""
    n = len(next(iter(columns.values())))
    lines = []
    for i in range(n):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(rng))
        lines.append(json.dumps({"path": f"{i}.jpg", **{k: v[i] for k, v in columns.items()}}))
    lst = tmp_path / "list.jsonl"
    lst.write_text("\n".join(lines) + "\n")
    return lst


def fields(dst) -> dict:
    ds = formats.open_shards(dst)
    return {f.name: (f.type, f.dtype, f.shape) for f in ds.fields if f.name not in ("image", "key")}


def column(dst, name) -> list:
    ds = formats.open_shards(dst)
    return [ds[i][name] for i in range(len(ds))]


def test_lists_of_numbers_become_ndarrays_typed_on_every_row(tmp_path, rng):
    lst = jsonl(tmp_path, rng, {
        "ids": [[1, 2, 3], [], [4]],                               # ints: int64 [None]
        "boxes": [[[1, 2, 3, 4]], [], [[5, 6, 7, 8.5], [0, 0, 1, 1]]],  # a float late: float32
        "late_k": [[], [[1, 2]], [[3, 4], [5, 6]]],                # the first row says nothing
        "n": [1, 2, 3], "s": ["a", "b", "c"], "x": [1.5, 2, 3],    # scalars: as before
    })
    pack(lst, tmp_path / "dst", opts())
    assert fields(tmp_path / "dst") == {
        "ids": ("ndarray", "<i8", (None,)), "boxes": ("ndarray", "<f4", (None, 4)),
        "late_k": ("ndarray", "<i8", (None, 2)),
        "n": ("int", None, None), "s": ("str", None, None), "x": ("float", None, None)}
    boxes = column(tmp_path / "dst", "boxes")
    assert [b.shape for b in boxes] == [(1, 4), (0, 4), (2, 4)]
    np.testing.assert_array_equal(boxes[2], np.float32([[5, 6, 7, 8.5], [0, 0, 1, 1]]))
    assert [a.tolist() for a in column(tmp_path / "dst", "ids")] == [[1, 2, 3], [], [4]]


@pytest.mark.parametrize("values", [
    [[[1, 2]], [[1, 2, 3]]],          # ragged inner lists
    [[1, [2]], [3]],                  # mixed depth in a row
    [[[1, 2]], [3, 4]],               # mixed depth across rows
    [["a", "b"], ["c"]],              # text
    [[True], [False]],                # booleans are not numbers
    [[[[1]]], [[[2]]]],               # deeper than [None, k]
    [{"a": 1}, {"b": [2]}],           # objects
    [[], []],                         # nothing to infer a dtype from
    [[1], [1 << 70]],                 # no int64 holds it
])
def test_other_lists_and_objects_become_json(tmp_path, rng, values):
    lst = jsonl(tmp_path, rng, {"v": values})
    pack(lst, tmp_path / "dst", opts())
    assert fields(tmp_path / "dst") == {"v": ("json", None, None)}
    assert column(tmp_path / "dst", "v") == values


def test_lists_mixed_with_plain_values_are_refused_naming_lines(tmp_path, rng):
    lst = jsonl(tmp_path, rng, {"v": [[1, 2], [3], 4]})
    with pytest.raises(InputError, match=r"column 'v': line 1 holds a list, line 3 an integer.*"
                                         r"--field v=json"):
        pack(lst, tmp_path / "dst", opts())
    pack(lst, tmp_path / "dst", opts(field_types=(("v", "json"),)))
    assert column(tmp_path / "dst", "v") == [[1, 2], [3], 4]


def test_a_field_type_replaces_the_inference(tmp_path, rng):
    lst = jsonl(tmp_path, rng, {"b": [[[1, 2]], [[3, 4]]], "ids": [[1], [2]],
                                "n": [1, 2], "m": [[1], [2]]})
    pack(lst, tmp_path / "dst", opts(field_types=(("b", "float64"), ("ids", "uint8"),
                                                  ("n", "float"), ("m", "json"))))
    assert fields(tmp_path / "dst") == {
        "b": ("ndarray", "<f8", (None, 2)), "ids": ("ndarray", "|u1", (None,)),
        "n": ("float", None, None), "m": ("json", None, None)}
    assert column(tmp_path / "dst", "n") == [1.0, 2.0] and column(tmp_path / "dst", "m") == [[1], [2]]


def test_a_row_that_does_not_fit_its_field_type_fails_or_is_skipped(tmp_path, rng):
    # Most rows have [None, 2]: the shape is theirs, not the first row's.
    lst = jsonl(tmp_path, rng, {"b": [[[1, 2, 3]], [[1, 2]], [[3, 4], [5, 6]], [], [[7, 300]]]})
    with pytest.raises(PackInputError) as info:
        pack(lst, tmp_path / "fail", opts(field_types=(("b", "uint8"),)))
    assert info.value.kind == "bad-row" and "list.jsonl line 1" in str(info.value)
    assert "[None, 2]" in str(info.value)
    s = pack(lst, tmp_path / "skip", opts(field_types=(("b", "uint8"),), on_error="skip"))
    assert (s.records_written, dict(s.skipped), s.records_in) == (3, {"bad-row": 2}, 5)
    lines = [json.loads(x) for x in (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()]
    assert [x["path"] for x in lines] == ["0.jpg", "4.jpg"]
    assert "line 5" in lines[1]["reason"] and "outside uint8's range" in lines[1]["reason"]
    assert [a.shape for a in column(tmp_path / "skip", "b")] == [(1, 2), (2, 2), (0, 2)]


def test_csv_cells_hold_json_for_list_types_and_text_stays_text(tmp_path, rng):
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(rng))
    lst = tmp_path / "list.csv"
    lst.write_text('path,zip,pts\n0.jpg,007,"[1.5, 2]"\n1.jpg,010,"[]"\n2.jpg,123,"[3]"\n')
    pack(lst, tmp_path / "plain", opts())  # inferred: "007" is no plain integer, so text
    assert fields(tmp_path / "plain") == {"zip": ("str", None, None), "pts": ("str", None, None)}
    assert column(tmp_path / "plain", "zip") == ["007", "010", "123"]
    pack(lst, tmp_path / "dst", opts(field_types=(("zip", "str"), ("pts", "float32"))))
    assert column(tmp_path / "dst", "zip") == ["007", "010", "123"]
    assert [a.tolist() for a in column(tmp_path / "dst", "pts")] == [[1.5, 2.0], [], [3.0]]
    lst.write_text('path,pts\n0.jpg,"[1, 2"\n1.jpg,"[1]"\n')
    s = pack(lst, tmp_path / "bad", opts(field_types=(("pts", "json"),), on_error="skip"))
    assert dict(s.skipped) == {"bad-row": 1} and s.records_written == 1


def test_nan_in_a_json_column_is_a_bad_row(tmp_path, rng):
    lst = tmp_path / "list.jsonl"
    for i in range(2):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(rng))
    lst.write_text('{"path": "0.jpg", "v": [[1], [2, NaN]]}\n{"path": "1.jpg", "v": [[1]]}\n')
    s = pack(lst, tmp_path / "dst", opts(on_error="skip"))
    assert dict(s.skipped) == {"bad-row": 1} and column(tmp_path / "dst", "v") == [[[1]]]


def test_list_columns_survive_other_formats(tmp_path, rng):
    lst = jsonl(tmp_path, rng, {"b": [[[1.5, 2]], [], [[3, 4], [5, 6]]], "ids": [[1], [], [2, 3]],
                                "meta": [{"a": [1]}, {}, {"b": None}]})
    pack(lst, tmp_path / "direct", opts())
    for sink in ("webdataset", "parquet", "tfrecord"):
        pack(lst, tmp_path / sink, opts(sink=sink))
        pack(tmp_path / sink, tmp_path / f"{sink}-back", opts(source=sink))
        for name in ("b", "ids", "meta"):
            got, want = column(tmp_path / f"{sink}-back", name), column(tmp_path / "direct", name)
            assert all(np.array_equal(g, w) and getattr(g, "dtype", None) == getattr(w, "dtype", None)
                       for g, w in zip(got, want, strict=True)), (sink, name)


def test_field_misuse_is_a_usage_error(tmp_path, rng, capsys):
    lst = jsonl(tmp_path, rng, {"v": [[1], [2]]})
    for argv in (["--field", "path=str"], ["--field", "v=float128"],
                 ["--field", "v=json", "--field", "v=int"]):
        assert main([str(lst), str(tmp_path / "x"), "-q", *argv]) == 2, argv
        assert "--field" in capsys.readouterr().err
    # A column the list does not have is found by reading SRC: a data error, one line.
    assert main([str(lst), str(tmp_path / "x"), "-q", "--field", "nope=json"]) == 1
    err = capsys.readouterr().err
    assert "--field names ['nope']" in err and "usage:" not in err
    with pytest.raises(SystemExit) as info:  # argparse's own usage error
        main([str(lst), str(tmp_path / "x"), "--field", "v"])
    assert info.value.code == 2 and "expected NAME=TYPE" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--field types the columns of a file list"):
        pack(tmp_path, tmp_path / "y", opts(source="files", field_types=(("v", "json"),)))
    assert main([str(lst), str(tmp_path / "z"), "-q", "--field", "v=float32"]) == 0
    assert column(tmp_path / "z", "v")[0].dtype == np.float32


def test_csv_cells_come_back_as_written_line_breaks_and_all(tmp_path, rng):
    import csv

    notes = ["a\nb", "c\r\nd", "e\u2028f", "plain"]
    ids = ["00123", "1_000", "+5", " 7 "]
    with open(tmp_path / "list.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "note", "id", "n"])
        for i in range(4):
            (tmp_path / f"{i}.jpg").write_bytes(jpeg(rng))
            w.writerow([f"{i}.jpg", notes[i], ids[i], str(-i)])
    pack(tmp_path / "list.csv", tmp_path / "ds", opts())
    assert column(tmp_path / "ds", "note") == notes
    assert column(tmp_path / "ds", "id") == ids  # none is a plain integer: text, as written
    assert fields(tmp_path / "ds")["n"] == ("int", None, None)
    assert column(tmp_path / "ds", "n") == [0, -1, -2, -3]


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path, rng):
    (tmp_path / "0.jpg").write_bytes(jpeg(rng))
    (tmp_path / "list.jsonl").write_text('{"path": "0.jpg", "t": "x\u2028y\u0085z"}\n',
                                         encoding="utf-8")
    pack(tmp_path / "list.jsonl", tmp_path / "ds", opts())
    assert column(tmp_path / "ds", "t") == ["x\u2028y\u0085z"]


@pytest.mark.parametrize("suffix, body, line", [
    (".csv", f"path,big\n0.jpg,1\n1.jpg,{1 << 63}\n", 3),
    (".jsonl", '{"path": "0.jpg", "big": 1}\n{"path": "1.jpg", "big": ' + f'{1 << 63}}}\n', 2),
])
def test_an_integer_beyond_int64_is_a_bad_row_named_by_line(tmp_path, rng, suffix, body, line):
    for i in range(2):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(rng))
    lst = tmp_path / f"list{suffix}"
    lst.write_text(body)
    with pytest.raises(PackInputError,
                       match=rf"line {line}: column 'big' \(int\): {1 << 63} does not fit"):
        pack(lst, tmp_path / "dst", opts())
    s = pack(lst, tmp_path / "ok", opts(on_error="skip"))
    assert dict(s.skipped) == {"bad-row": 1} and column(tmp_path / "ok", "big") == [1]


def test_field_label_str_is_refused_not_ignored(tmp_path, rng):
    (tmp_path / "0.jpg").write_bytes(jpeg(rng))
    (tmp_path / "list.csv").write_text("path,label\n0.jpg,cat\n")
    with pytest.raises(UsageError, match=r"label=str.*another name"):
        pack(tmp_path / "list.csv", tmp_path / "ds", opts(field_types=(("label", "str"),)))
    assert not (tmp_path / "ds").exists()
    assert main([str(tmp_path / "list.csv"), str(tmp_path / "ds"), "--field", "label=str"]) == 2


def test_a_column_of_booleans_says_what_to_do(tmp_path, rng):
    (tmp_path / "0.jpg").write_bytes(jpeg(rng))
    (tmp_path / "list.jsonl").write_text('{"path": "0.jpg", "flag": true}\n')
    with pytest.raises(InputError) as e:
        pack(tmp_path / "list.jsonl", tmp_path / "ds", opts())
    text = str(e.value)
    assert "line 1 holds a boolean" in text and "--field flag=json" in text
    assert "expected" not in text
    pack(tmp_path / "list.jsonl", tmp_path / "ok", opts(field_types=(("flag", "json"),)))
    assert column(tmp_path / "ok", "flag") == [True]
