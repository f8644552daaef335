"""inspect-shards on non-image data: text, JSON, ragged arrays, audio bytes (sound,
cut short, damaged), shown as excerpts; ragged lengths from the index; extract's file forms."""

from __future__ import annotations

import io
import json
import struct
import wave

import numpy as np
import pytest

from formats import DatasetWriter, Field
from formats.audio_header import audio_info
from reader.inspect.cli import main

FIELDS = [
    Field("key", "str"),
    Field("text", "str"),
    Field("meta", "json"),
    Field("tokens", "ndarray", dtype="int32", shape=(None,)),
    Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
    Field("audio", "bytes"),
    Field("image", "jpeg"),
]


def make_wav(seconds: float = 0.5, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(seconds * rate)))
    return buf.getvalue()


def make_flac_header(rate: int = 16000, channels: int = 2, bits: int = 16,
                     total: int = 8000) -> bytes:
    """``fLaC`` and a STREAMINFO block: what a FLAC header says (no audio frames)."""
    packed = (rate << 44) | ((channels - 1) << 41) | ((bits - 1) << 36) | total
    info = struct.pack(">HH", 4096, 4096) + bytes(6) + packed.to_bytes(8, "big") + bytes(16)
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


def make_mp3_frame(frames: int | None = None) -> bytes:
    """An MPEG-1 layer III frame header (128 kbit/s, 44,100 Hz, stereo), with a Xing
    frame count when ``frames`` is given."""
    head = b"\xff\xfb\x90\x00" + bytes(32)  # 32 bytes of side info (MPEG-1, stereo)
    xing = b"Xing" + struct.pack(">II", 1, frames) if frames else bytes(12)
    return head + xing + bytes(400)


def make_jpeg(h: int = 12, w: int = 16) -> bytes:
    simplejpeg = pytest.importorskip("simplejpeg")
    return simplejpeg.encode_jpeg(np.full((h, w, 3), 99, np.uint8), quality=80)


@pytest.fixture
def records(rng):
    wav = make_wav()
    audio = [wav, wav[:30], wav[:2044], make_flac_header(), make_mp3_frame(100)]
    out = []
    for i, clip in enumerate(audio):
        n = int(rng.integers(1, 40))
        out.append({
            "key": f"clips/{i}",  # no suffix: raw bytes are named by their signature
            "text": f"line one of {i}\n\tand then " + "lorem ipsum " * (10 + i),
            "meta": {"speaker": f"s{i}", "tags": list(range(i + 3)), "rate": 8000},
            "tokens": rng.integers(0, 50_000, n).astype(np.int32),
            "boxes": rng.random((i, 4), np.float32),  # record 0 has no boxes: shape [0, 4]
            "audio": clip,
            "image": make_jpeg(),
        })
    return out


@pytest.fixture
def dataset(tmp_path, records):
    root = tmp_path / "any"
    with DatasetWriter(root, FIELDS, records_per_shard=2, durable=False) as w:
        for r in records:
            w.write(r)
    return root


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- audio headers --------------------------------------------------------------------

def test_wav_flac_and_mp3_headers_give_duration_rate_and_channels():
    assert audio_info(make_wav(0.5, 8000)) == {"kind": "wav", "format_tag": 1,
                                               "sample_rate": 8000, "channels": 1, "bits": 16,
                                               "duration_s": 0.5}
    assert audio_info(make_flac_header(16000, 2, 24, 8000)) == {
        "kind": "flac", "sample_rate": 16000, "channels": 2, "bits": 24, "duration_s": 0.5}
    assert audio_info(make_mp3_frame(100)) == {"kind": "mp3", "sample_rate": 44100,
                                               "channels": 2, "bitrate_kbps": 128,
                                               "duration_s": 100 * 1152 / 44100}
    no_count = audio_info(make_mp3_frame())
    assert no_count["bitrate_kbps"] == 128 and "duration_s" not in no_count
    id3 = b"ID3\x04\x00\x00\x00\x00\x01\x00" + bytes(128) + make_mp3_frame(10)  # 128-byte tag
    assert audio_info(id3)["duration_s"] == pytest.approx(10 * 1152 / 44100)
    assert audio_info(make_flac_header(total=0)).get("duration_s") is None  # "unknown"
    assert audio_info(b"just some text") is None and audio_info(make_jpeg()) is None


def test_a_wav_cut_in_its_data_keeps_the_header_duration_and_says_what_is_there():
    info = audio_info(make_wav(0.5, 8000)[:2044])
    assert info["duration_s"] == 0.5 and info["present_s"] == pytest.approx(2000 / 16000)


@pytest.mark.parametrize("payload", [make_wav(), make_flac_header(), make_mp3_frame(7),
                                     b"ID3\x04\x00\x00\x00\x00\x01\x00" + make_mp3_frame()])
def test_every_cut_of_a_header_is_unreadable_never_an_exception(payload):
    for n in range(len(payload) + 1):
        info = audio_info(payload[:n])
        assert info is None or "error" in info or "sample_rate" in info, n


@pytest.mark.parametrize("payload, says", [
    (b"RIFF\x00\x00\x00\x00WAVEfmt \x04\x00\x00\x00abcd", "fmt chunk of 4 bytes"),
    (b"RIFF\x00\x00\x00\x00WAVEdata\x10\x00\x00\x00", "data chunk before the fmt chunk"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00" + bytes(16) + b"data", "0 channels"),
    (b"RIFF\x00\x00\x00\x00WAVE" + b"junk\x00\x00\x00\x00" * 100, "no data chunk"),
    (b"RIFF\x00\x00\x00\x00WAVEjunk\xff\xff\xff\xff", "cut short"),
    (b"fLaC\x04\x00\x00\x22" + bytes(34), "not a 34-byte STREAMINFO"),
    (b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"not a frame", "no MPEG layer III frame"),
    (b"ID3\x04\x00\x00\x80\x80\x80\x80", "not syncsafe"),
])
def test_malformed_headers_say_unreadable_and_why(payload, says):
    info = audio_info(payload)
    assert info["error"].startswith("unreadable header: ") and says in info["error"], info


# -- show -------------------------------------------------------------------------------

def test_show_prints_excerpts_shapes_values_and_audio_durations(dataset, records, capsys):
    r = records[2]
    code, out, err = run(capsys, dataset, "show", "2")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    text = r["text"]
    assert repr(text[:80]) + f"... ({len(text)} chars)" in lines["text"]  # \n and \t escaped
    assert len(out.splitlines()) == 3 + len(FIELDS)  # a title, a header, a line per field
    meta = json.dumps(r["meta"], separators=(",", ":"), sort_keys=True)
    assert f"{meta} (object, 3 keys, {len(meta)} chars)" in lines["meta"]
    t = r["tokens"]
    shown = ", ".join(str(v) for v in t[:6]) + (", ..." if t.size > 6 else "")
    assert f"int32 {t.size} of [None]: [{shown}], min {t.min()} max {t.max()}" in lines["tokens"]
    assert f"float32 2x4 of [None, 4]: [{r['boxes'].reshape(-1)[0]:.4g}," in lines["boxes"]
    assert "2,044 bytes, wav, 0.50 s, truncated: 0.12 s present, 8000 Hz, 1 ch, 16 bit" \
        in lines["audio"]
    assert "jpeg 16x12, ff d8 ff" in lines["image"]
    assert repr("clips/2") + " (7 chars)" in lines["key"]


@pytest.mark.parametrize("index, says", [
    (0, "wav, 0.50 s, 8000 Hz, 1 ch, 16 bit"),
    (1, "30 bytes, wav, unreadable header: cut short at byte 30"),
    (3, "flac, 0.50 s, 16000 Hz, 2 ch, 16 bit"),
    (4, "mp3, 2.61 s, 44100 Hz, 2 ch, 128 kbit/s"),
])
def test_show_names_each_audio_kind_and_survives_a_damaged_header(dataset, capsys, index, says):
    code, out, err = run(capsys, dataset, "show", index)
    assert code == 0 and says in out and "Traceback" not in err, out


def test_show_json_carries_the_figures(dataset, records, capsys):
    code, out, _ = run(capsys, dataset, "show", "0", "--json")
    assert code == 0
    f = json.loads(out)["fields"]
    r = records[0]
    assert f["text"] == {"type": "str", "stored": len(r["text"].encode()),
                         "length": len(r["text"]), "excerpt": r["text"][:80], "truncated": True}
    assert f["key"]["excerpt"] == "clips/0" and f["key"]["truncated"] is False
    assert f["meta"]["json_type"] == "object" and f["meta"]["items"] == 3
    assert f["tokens"]["shape"] == [r["tokens"].size] and f["tokens"]["dtype"] == "int32"
    assert f["tokens"]["values"] == r["tokens"][:6].tolist()
    assert f["tokens"]["schema_shape"] == [None]
    assert f["boxes"]["shape"] == [0, 4] and "min" not in f["boxes"]  # empty: no min/max
    assert f["audio"]["sniffed"] == "wav" and f["audio"]["audio"]["duration_s"] == 0.5
    assert (f["image"]["width"], f["image"]["height"]) == (16, 12)


# -- info and stats: lengths from the index ---------------------------------------------

def test_info_reports_ragged_array_lengths(dataset, records, capsys):
    code, out, _ = run(capsys, dataset, "info", "--json")
    lengths = json.loads(out)["field_lengths"]
    assert set(lengths) == {"tokens", "boxes"}  # info: variable-shape arrays only
    sizes = [r["tokens"].size for r in records]
    tok = lengths["tokens"]
    assert tok["unit"] == "elements" and tok["elements_total"] == sum(sizes)
    assert (tok["rows"]["min"], tok["rows"]["p50"], tok["rows"]["max"]) == \
        (min(sizes), float(np.median(sizes)), max(sizes))
    boxes = lengths["boxes"]
    assert boxes["elements_total"] == 4 * sum(range(5)) and boxes["rows"]["max"] == 4
    assert boxes["lengths"]["max"] == 16 and boxes["malformed"] == 0
    code, out, _ = run(capsys, dataset, "info")
    assert code == 0 and "variable-shape array" in out
    row = [line for line in out.splitlines() if line.startswith("boxes ")][-1]
    assert row.split()[1:8] == ["0", "/", "2", "/", "4", "0", "/"] and row.split()[-1] == "40"


def test_info_on_an_image_dataset_reads_no_index(tmp_path, rng, capsys):
    from tests.helpers_codecs import make_dataset, make_records

    root = make_dataset(tmp_path / "img", make_records(rng, 3))
    for idx in root.glob("*.idx"):
        idx.unlink()  # info, with no ragged arrays, needs the manifest only
    code, out, _ = run(capsys, root, "info", "--json")
    assert code == 0 and "field_lengths" not in json.loads(out)


def test_stats_reports_every_variable_size_field(dataset, records, capsys):
    code, out, _ = run(capsys, dataset, "stats", "--json")
    lengths = json.loads(out)["field_lengths"]
    assert set(lengths) == {"key", "text", "meta", "tokens", "boxes", "audio"}  # not image
    audio = [len(r["audio"]) for r in records]
    assert lengths["audio"]["unit"] == "bytes"
    assert (lengths["audio"]["lengths"]["min"], lengths["audio"]["lengths"]["max"],
            lengths["audio"]["lengths"]["total"]) == (min(audio), max(audio), sum(audio))
    text = [len(r["text"].encode()) for r in records]
    assert lengths["text"]["lengths"]["p50"] == float(np.median(text))
    assert lengths["tokens"]["lengths"]["total"] == sum(r["tokens"].size for r in records)
    code, out, _ = run(capsys, dataset, "stats")
    assert code == 0 and "field size" in out
    assert any(line.startswith("tokens") and "elements" in line for line in out.splitlines())


def test_stats_plot_draws_a_histogram_per_variable_size_field(dataset, capsys, tmp_path,
                                                                monkeypatch):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    import matplotlib.figure

    titles = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *a, **k):
        titles.extend(ax.get_title() for ax in fig.axes)
        return save(fig, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    code, _, _ = run(capsys, dataset, "stats", "--plot", tmp_path / "p" / "s.png")
    assert code == 0 and (tmp_path / "p" / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert {"tokens: elements per record", "boxes: elements per record",
            "text: bytes per record", "audio: bytes per record"} <= set(titles)


def test_a_compressed_ragged_field_reports_stored_sizes_only(tmp_path, rng, capsys):
    root = tmp_path / "z"
    fields = [Field("tokens", "ndarray", compression="zstd", dtype="int32", shape=(None,))]
    with DatasetWriter(root, fields, records_per_shard=2, durable=False) as w:
        for n in (3, 300, 30):
            w.write({"tokens": np.zeros(n, np.int32)})
    code, out, _ = run(capsys, root, "info", "--json")
    tok = json.loads(out)["field_lengths"]["tokens"]
    assert code == 0 and tok["unit"] == "stored bytes" and "elements_total" not in tok
    code, out, _ = run(capsys, root, "info")
    assert "zstd: stored bytes" in out


def test_a_damaged_index_is_an_error_without_traceback(dataset, capsys):
    idx = dataset / "shard-00001.idx"
    data = bytearray(idx.read_bytes())
    data[0:4] = b"XXXX"
    idx.write_bytes(bytes(data))
    code, _, err = run(capsys, dataset, "stats")
    assert code == 1 and "shard-00001.idx" in err and "not a shardpack index" in err
    assert "Traceback" not in err
    idx.unlink()
    code, _, err = run(capsys, dataset, "info")
    assert code == 1 and "index file is missing" in err


# -- extract ----------------------------------------------------------------------------

def test_extract_writes_each_type_in_its_form(dataset, records, capsys, tmp_path):
    r = records[3]
    out = tmp_path / "out"
    for field in ("text", "meta", "tokens", "boxes", "audio", "image", "key"):
        code, said, err = run(capsys, dataset, "extract", "3", "--field", field, "--out", f"{out}/")
        assert code == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["3.audio.flac", "3.boxes.npy", "3.image.jpg", "3.key.txt", "3.meta.json",
                     "3.text.txt", "3.tokens.npy"]
    assert (out / "3.text.txt").read_text() == r["text"]
    assert json.loads((out / "3.meta.json").read_text()) == r["meta"]
    tokens = np.load(out / "3.tokens.npy", allow_pickle=False)
    assert tokens.dtype == np.int32 and np.array_equal(tokens, r["tokens"])
    assert np.array_equal(np.load(out / "3.boxes.npy", allow_pickle=False), r["boxes"])
    assert (out / "3.audio.flac").read_bytes() == r["audio"]
    code, said, _ = run(capsys, dataset, "extract", "0", "--field", "audio", "--out", out)
    assert code == 0 and (out / "0.audio.wav").read_bytes() == records[0]["audio"]
    assert "0.audio.wav" in said


def test_extract_takes_a_raw_field_extension_from_its_name_or_the_key(tmp_path, capsys):
    root = tmp_path / "raw"
    fields = [Field("key", "str"), Field("blob", "bytes"), Field("clip.ogg", "bytes")]
    with DatasetWriter(root, fields, durable=False) as w:
        w.write({"key": "a/b/sample.Dat", "blob": b"\xff\xfe", "clip.ogg": b"OggS"})
        w.write({"key": "no-suffix", "blob": b"\xff\xfe", "clip.ogg": b"OggS"})
    for index, field, name in ((0, "blob", "0.blob.dat"), (0, "clip.ogg", "0.clip.ogg"),
                               (1, "blob", "1.blob.bin")):
        code, _, err = run(capsys, root, "extract", index, "--field", field, "--out", f"{tmp_path}/o/")
        assert code == 0 and (tmp_path / "o" / name).exists(), (name, err)
    code, _, err = run(capsys, root, "extract", "0", "--out", tmp_path / "x")  # no image field
    assert code == 1 and "--field" in err and "'blob'" in err
