"""Metric sinks: the protocol in the Monitor, and each backend read back with its own reader.

TensorBoard event files are read with tensorboard's event accumulator, Prometheus
through a real HTTP scrape (or a real push) parsed by prometheus_client's text parser,
W&B from an offline run's transaction log, JSONL with ``load_records``. A backend
that is not installed skips its tests, saying which package to install.
"""

from __future__ import annotations

import errno
import glob
import http.server
import json
import logging
import os
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from typing import ClassVar

import pytest

from reader import MonitorSinkError
from reader.monitor import JsonlSink, Monitor, PrometheusSink, TensorBoardSink, WandbSink
from reader.monitor import monitor as monitor_mod
from reader.monitor import sinks as sinks_mod
from reader.monitor.diagnosis import KINDS
from reader.monitor.report import METRICS, load_records
from tests.helpers_monitor import CPU_BOUND, HEALTHY, IO_BOUND, FakeClock, feed
from tests.hostile import mount_tmpfs, umount

KEYS = [m.key for m in METRICS]


def run_monitor(sinks, *, name="train", intervals=3, patterns=(HEALTHY,), record=None,
                monitor=None):  # fmt: skip
    """Feed a Monitor on a fake clock one interval per pattern (cycled) and return it
    with the records it sent."""
    seen = []
    clock = FakeClock()
    mon = monitor or Monitor(1.0, output=False, sinks=[*sinks, seen.append], record=record,
                             name=name, clock=clock, cpu=None, num_workers=2)  # fmt: skip
    for i in range(intervals):
        feed(mon, clock, patterns[i % len(patterns)], 50, start=50 * i)
        mon.flush()
    return mon, seen


# -- the protocol ------------------------------------------------------------------------


def test_every_sink_gets_the_jsonl_record(tmp_path):
    path = tmp_path / "run.jsonl"
    mon, seen = run_monitor([], record=path)
    lines = load_records(path)
    assert len(seen) == len(lines) == mon.reports == 3
    # The record= file is one sink among the others: the same dict, line for line.
    assert [json.loads(json.dumps(r, sort_keys=True)) for r in seen] == lines
    assert set(KEYS) <= set(lines[-1]["current"]) and lines[-1]["diagnosis"]["kind"] in KINDS
    assert lines[-1]["sink_errors"] == {}


def test_a_sink_that_raises_is_logged_once_counted_and_the_others_go_on(caplog):
    calls = []

    def broken(record):
        calls.append(record["interval"])
        raise RuntimeError("backend down")

    caplog.set_level(logging.WARNING, logger=monitor_mod.__name__)
    mon, seen = run_monitor([broken], intervals=4)
    assert calls == [1, 2, 3, 4]  # tried again every report
    assert len(seen) == 4  # the sink after it still gets every record
    assert mon.stats()["sink_errors"] == {"test_a_sink_that_raises_is_logged_once_counted_and_the_others_go_on.<locals>.broken": 4}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "broken" in said[0] and "backend down" in said[0], said
    # The count travels with the records too (as it stood before that report).
    assert seen[-1]["sink_errors"] and list(seen[-1]["sink_errors"].values()) == [3]


def test_a_named_sink_is_named_in_the_log_and_the_counts(caplog):
    class Flaky:
        name = "flaky backend"

        def __call__(self, record):
            raise OSError(errno.EIO, "I/O error")

    caplog.set_level(logging.WARNING, logger=monitor_mod.__name__)
    mon, _ = run_monitor([Flaky()], intervals=2)
    assert mon.stats()["sink_errors"] == {"flaky backend": 2}
    assert "flaky backend" in caplog.records[0].getMessage()
    assert "monitor train" in caplog.records[0].getMessage()


@pytest.mark.parametrize(("sinks", "words"), [
    (print, "pass sinks=\\[sink\\]"),
    ("runs/x", "pass sinks=\\[sink\\]"),
    ([42], "expected callables"),
    (7, "expected a list"),
])  # fmt: skip
def test_sinks_must_be_a_list_of_callables(sinks, words):
    from formats.errors import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match=words):
        Monitor(1.0, sinks=sinks)
    with pytest.raises(ArgumentTypeError, match=words):
        monitor_mod.enable_monitor(sinks=sinks)
    monitor_mod.disable_monitor()


def test_enable_monitor_shares_its_sinks_between_loaders():
    seen = []
    try:
        monitor_mod.enable_monitor(1.0, output=False, sinks=[seen.append])
        a = monitor_mod.default_monitor(num_workers=2)
        b = monitor_mod.default_monitor(num_workers=2)
    finally:
        monitor_mod.disable_monitor()
    for mon in (a, b):
        mon._cpu = None
        clock = FakeClock()
        mon._clock = clock
        feed(mon, clock, HEALTHY, 10)
        mon.flush()
    assert [r["name"] for r in seen] == [a.name, b.name] and a.name != b.name


def test_jsonl_sink_refuses_a_file_it_cannot_append_to_where_it_is_given(tmp_path):
    with pytest.raises(MonitorSinkError, match="cannot append monitor records") as info:
        Monitor(1.0, record=tmp_path / "no-such-folder" / "run.jsonl")
    assert info.value.path == str(tmp_path / "no-such-folder" / "run.jsonl")
    assert isinstance(info.value, OSError)


def test_jsonl_on_a_full_disk_is_counted_and_the_loader_goes_on(tmp_path):
    point = tmp_path / "mnt"
    if not mount_tmpfs(point, "64k"):
        pytest.skip("cannot mount a tmpfs here (not root, or mount not permitted)")
    try:
        sink = JsonlSink(point / "run.jsonl")
        fill(point)
        mon, seen = run_monitor([sink], intervals=3)
        assert len(seen) == 3
        assert mon.stats()["sink_errors"] == {sink.name: 3}
    finally:
        umount(point)


def fill(point) -> None:
    """Fill a small tmpfs to the last byte."""
    with open(point / "fill", "wb") as f:
        try:
            f.write(b"\0" * (1 << 20))
        except OSError:
            pass


def test_metric_names_are_grouped_and_none_is_left_out():
    record = {"name": None, "current": {"decode_share_pct": 12, "h2d_gb_s": None}}
    assert sinks_mod.scalars(record) == {"decode_share_pct": 12.0}
    assert sinks_mod.metric_prefix(None) == "shardpack"
    assert sinks_mod.metric_prefix("val") == "shardpack/val"


# -- TensorBoard -------------------------------------------------------------------------


def _writers():
    out = []
    try:
        from torch.utils.tensorboard import SummaryWriter as torch_writer

        out.append(pytest.param(torch_writer, id="torch"))
    except ImportError:
        out.append(pytest.param(None, id="torch", marks=pytest.mark.skip(
            reason="torch.utils.tensorboard not importable (pip install torch tensorboard)")))
    try:
        from tensorboardX import SummaryWriter as x_writer

        out.append(pytest.param(x_writer, id="tensorboardX"))
    except ImportError:
        out.append(pytest.param(None, id="tensorboardX", marks=pytest.mark.skip(
            reason="tensorboardX not installed (pip install tensorboardX)")))
    return out


@pytest.fixture(params=_writers())
def writer(request, monkeypatch):
    """Each SummaryWriter the sink can use, in turn."""
    pytest.importorskip("tensorboard", reason="reading event files needs tensorboard "
                        "(pip install tensorboard)")
    monkeypatch.setattr(sinks_mod, "_summary_writer", lambda: request.param)
    return request.param


def read_events(logdir):
    """Scalars and texts of a log folder, as TensorBoard reads them."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]}
    texts = {}
    for t in tags.get("tensors", []):
        # Text summaries are string tensors (the text plugin), one per event.
        texts[t] = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(t)]
    return scalars, texts


def test_tensorboard_events_hold_every_figure_and_each_verdict_change(tmp_path, writer):
    sink = TensorBoardSink(tmp_path / "runs")
    _, seen = run_monitor([sink], intervals=4, patterns=(HEALTHY, HEALTHY, IO_BOUND, IO_BOUND))
    sink.close()
    scalars, texts = read_events(tmp_path / "runs")
    for key in KEYS:
        values = [r["current"][key] for r in seen]
        tag = f"shardpack/train/{key}"
        if values[0] is None:  # no device copies, no /proc here
            assert tag not in scalars
            continue
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4]
        assert [v for _, v in scalars[tag]] == pytest.approx(values, rel=1e-6), key
    assert "shardpack/train/h2d_gb_s" not in scalars
    # The verdict as text, written when its kind or cause changes.
    verdicts = [(r["diagnosis"]["kind"], r["diagnosis"]["cause"]) for r in seen]
    changed = [r for i, r in enumerate(seen) if i == 0 or verdicts[i] != verdicts[i - 1]]
    assert len(changed) == 2 and verdicts[-1][0] == "io-bound", verdicts
    (tag,) = [t for t in texts if t.startswith("shardpack/train/diagnosis")]
    assert texts[tag] == [(r["interval"], r["diagnosis"]["message"]) for r in changed]


def test_tensorboard_steps_follow_the_trainers_step(tmp_path, writer):
    step = {"n": 100}
    sink = TensorBoardSink(tmp_path / "runs", step=lambda: step["n"])
    clock = FakeClock()
    mon = Monitor(1.0, output=False, sinks=[sink], clock=clock, cpu=None, num_workers=2)
    for i in range(3):
        feed(mon, clock, HEALTHY, 50, start=50 * i)
        step["n"] += 50
        mon.flush()
    sink.close()
    scalars, _ = read_events(tmp_path / "runs")
    # An unnamed monitor writes the short names.
    assert [s for s, _ in scalars["shardpack/samples_per_s"]] == [150, 200, 250]


def test_tensorboard_into_a_writer_of_your_own(tmp_path, writer):
    own = writer(str(tmp_path / "mine"))
    own.add_scalar("loss", 1.0, 0)
    sink = TensorBoardSink(own)
    run_monitor([sink], intervals=2)
    sink.close()  # leaves the writer open
    own.add_scalar("loss", 0.5, 1)
    own.close()
    scalars, _ = read_events(tmp_path / "mine")
    assert len(scalars["loss"]) == 2 and len(scalars["shardpack/train/samples_per_s"]) == 2



def test_tensorboard_on_a_read_only_disk_fails_where_it_is_made(small_disk, writer):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with pytest.raises(MonitorSinkError, match=r"cannot write TensorBoard logs .*Read-only") as info:
        TensorBoardSink(small_disk / "runs")
    assert info.value.path == str(small_disk / "runs")


# The writers' own threads die on the full disk, and say so.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_tensorboard_on_a_full_disk_is_counted_and_the_loader_goes_on(small_disk, writer,
                                                                       caplog):  # fmt: skip
    caplog.set_level(logging.WARNING, logger=monitor_mod.__name__)
    sink = TensorBoardSink(small_disk / "runs")
    mon, seen = run_monitor([sink], intervals=1)  # written while there is room
    fill(small_disk)
    mon, seen = run_monitor([sink], intervals=6)
    assert len(seen) == 6  # every report made, every other sink served
    errors = mon.stats()["sink_errors"]
    assert list(errors) == [sink.name] and 1 <= errors[sink.name] <= 6
    assert len([r for r in caplog.records if sink.name in r.getMessage()]) == 1
    os.unlink(small_disk / "fill")
    t0 = time.perf_counter()
    try:
        # torch's writer stopped at the failure and says so again here; tensorboardX's
        # writing thread died, and its close() would block on its full queue for ever
        sink.close()
    except MonitorSinkError as exc:
        assert ("not all written" in str(exc) or "did not close within" in str(exc))
        assert exc.path == str(small_disk / "runs")
    assert time.perf_counter() - t0 < sinks_mod.CLOSE_S + 2
    scalars, _ = read_events(small_disk / "runs")  # what was written reads back whole
    assert [s for s, _ in scalars["shardpack/train/samples_per_s"]][:1] == [1]


def test_a_tensorboard_writer_that_never_closes_is_said_not_waited_for(tmp_path, writer,
                                                                          monkeypatch):
    """tensorboardX's close() blocks for ever on its full queue once its writing thread
    died (a full disk, seen hanging the suite): close() gives up after CLOSE_S."""
    monkeypatch.setattr(sinks_mod, "CLOSE_S", 0.2)
    sink = TensorBoardSink(tmp_path / "runs")
    real, stuck = sink.writer, threading.Event()
    sink.writer = type("Stuck", (), {"close": lambda self: stuck.wait(5)})()
    t0 = time.perf_counter()
    with pytest.raises(MonitorSinkError, match=r"did not close within 0\.2 s"):
        sink.close()
    assert time.perf_counter() - t0 < 1
    stuck.set()
    real.close()


# -- Prometheus --------------------------------------------------------------------------


@pytest.fixture
def prometheus():
    return pytest.importorskip("prometheus_client", reason="pip install prometheus-client")


def families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict, name: str, **labels):
    fam = fams[name]
    hits = [s.value for s in fam.samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, fam.samples)
    return hits[0]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_prometheus_scrape_holds_every_figure_and_the_verdict(prometheus):
    sink = PrometheusSink(0, addr="127.0.0.1")
    try:
        clock = FakeClock()
        mons = {n: Monitor(1.0, output=False, sinks=[sink], name=n, clock=clock, cpu=None,
                           num_workers=2) for n in ("train", "val")}  # fmt: skip
        feed(mons["train"], clock, HEALTHY, 50)
        mons["train"].flush()
        feed(mons["val"], clock, CPU_BOUND, 50)
        mons["val"].flush()
        fams = families(scrape(sink.port))
    finally:
        sink.close()
    for name, mon in mons.items():
        cur = mon.stats()["current"]
        for key in KEYS:
            fam = f"shardpack_{key}"
            if cur[key] is None:
                assert all(s.labels.get("loader") != name for s in fams[fam].samples)
            else:
                assert sample(fams, fam, loader=name) == pytest.approx(cur[key]), key
        kind = mon.stats()["diagnosis"]["kind"]
        for state in KINDS:
            assert sample(fams, "shardpack_diagnosis", loader=name,
                          shardpack_diagnosis=state) == (1.0 if state == kind else 0.0)
        cause = mon.stats()["diagnosis"]["cause"] or ""
        assert sample(fams, "shardpack_diagnosis_cause_info", loader=name, cause=cause) == 1.0
    assert mons["val"].stats()["diagnosis"]["kind"] == "cpu-bound"
    # Closed: the port is free again.
    PrometheusSink(sink.port, addr="127.0.0.1").close()


def test_prometheus_drops_a_figure_that_becomes_unknown(prometheus):
    sink = PrometheusSink(0, addr="127.0.0.1")
    try:
        record = {"name": "t", "current": {"decode_share_pct": 40.0}, "diagnosis": {}}
        sink(record)
        assert sample(families(scrape(sink.port)), "shardpack_decode_share_pct", loader="t") == 40
        sink({**record, "current": {"decode_share_pct": None}})
        fams = families(scrape(sink.port))
        assert not fams["shardpack_decode_share_pct"].samples
    finally:
        sink.close()


def test_prometheus_port_in_use_is_named(prometheus):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MonitorSinkError, match=f"Prometheus port {port} on 127.0.0.1 is in use"):
            PrometheusSink(port, addr="127.0.0.1")


@pytest.mark.parametrize(("kwargs", "words"), [
    ({}, "exactly one"), ({"port": 1, "pushgateway": "h:1"}, "exactly one"),
    ({"port": 70000}, "0..65535"), ({"port": True}, "0..65535"),
])  # fmt: skip
def test_prometheus_arguments(prometheus, kwargs, words):
    from formats.errors import ArgumentError

    with pytest.raises(ArgumentError, match=words):
        PrometheusSink(**kwargs)


class Gateway(http.server.BaseHTTPRequestHandler):
    """A Pushgateway stand-in: keeps each pushed body (the text exposition)."""

    pushed: ClassVar[list] = []
    fail = False

    def do_PUT(self):  # http.server's spelling
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.fail:
            self.send_response(500)
        else:
            type(self).pushed.append((self.path, body.decode()))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_prometheus_push_sends_the_figures_from_its_own_thread(prometheus, caplog):
    Gateway.pushed, Gateway.fail = [], False
    server = http.server.HTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sink = PrometheusSink(pushgateway=f"127.0.0.1:{server.server_port}", job="train-job",
                              grouping_key={"rank": "3"})
        mon, seen = run_monitor([sink], intervals=2)
        sink.close()  # a last push, then the thread ends
        assert Gateway.pushed
        assert all(p == "/metrics/job/train-job/rank/3" for p, _ in Gateway.pushed), Gateway.pushed
        fams = families(Gateway.pushed[-1][1])
        assert sample(fams, "shardpack_samples_per_s", loader="train") == pytest.approx(
            seen[-1]["current"]["samples_per_s"])
        # A gateway that fails: the next report raises it (logged once, counted).
        Gateway.fail = True
        caplog.set_level(logging.WARNING, logger=monitor_mod.__name__)
        sink = PrometheusSink(pushgateway=f"127.0.0.1:{server.server_port}")
        sink({"name": "t", "current": {}, "diagnosis": {}})
        sink._wake.set()
        for _ in range(100):
            if sink._push_error is not None:
                break
            threading.Event().wait(0.05)
        mon, _ = run_monitor([sink], intervals=1)
        assert mon.stats()["sink_errors"] == {sink.name: 1}
        assert "500" in caplog.records[0].getMessage()
        sink.close()
    finally:
        server.shutdown()
        server.server_close()


# -- Weights & Biases --------------------------------------------------------------------


def wandb_history(run_dir, rows: int, timeout: float = 20.0) -> list[dict]:
    """The history rows of an offline run, read from its transaction log, once it holds
    ``rows`` of them: ``wandb.finish()`` (0.31) can return before W&B's service process
    has written the log out (seen: 7 bytes at the return, whole a second later)."""
    deadline = time.monotonic() + timeout
    while True:
        found = _wandb_log(run_dir)
        if len(found) >= rows or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _wandb_log(run_dir) -> list[dict]:
    """The history records of ``run-*.wandb`` (LevelDB-log framing: a 7-byte header,
    32 KiB blocks of fragments; each record a ``wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 7:
        return []
    assert data[:4] == b":W&B", data[:7]
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or its last fragment
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in rec.history.item})
    return rows


@pytest.fixture
def wandb_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="pip install wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run = wandb.init(mode="offline", dir=str(tmp_path), project="shardpack-test",
                     settings=wandb.Settings(console="off", x_disable_stats=True))
    yield run
    if wandb.run is not None:
        wandb.finish()


def test_wandb_offline_history_holds_the_figures_on_the_interval_axis(wandb_run):
    import wandb

    sink = WandbSink()
    mon, seen = run_monitor([sink], intervals=3, patterns=(HEALTHY, IO_BOUND))
    summary = dict(wandb_run.summary)
    run_dir = wandb_run.settings.sync_dir
    wandb.finish()
    assert summary["shardpack/train/samples_per_s"] == pytest.approx(
        seen[-1]["current"]["samples_per_s"])
    rows = [r for r in wandb_history(run_dir, 3) if "shardpack/train/interval" in r]
    assert [r["shardpack/train/interval"] for r in rows] == [1, 2, 3]
    for row, rec in zip(rows, seen, strict=True):
        for key in KEYS:
            if rec["current"][key] is None:
                assert f"shardpack/train/{key}" not in row
            else:
                assert row[f"shardpack/train/{key}"] == pytest.approx(rec["current"][key]), key
        assert row["shardpack/train/diagnosis"] == rec["diagnosis"]["kind"]
    assert mon.stats()["sink_errors"] == {}


def test_wandb_steps_follow_the_trainers_step(wandb_run):
    import wandb

    step = {"n": 10}
    sink = WandbSink(step=lambda: step["n"])
    clock = FakeClock()
    mon = Monitor(1.0, output=False, sinks=[sink], clock=clock, cpu=None, num_workers=2)
    for i in range(3):
        wandb_run.log({"loss": 1.0 / (i + 1)}, step=step["n"])
        feed(mon, clock, HEALTHY, 50, start=50 * i)
        mon.flush()
        step["n"] += 10
    run_dir = wandb_run.settings.sync_dir
    wandb.finish()
    rows = wandb_history(run_dir, 3)
    # The figures share the trainer's rows: one row per step with both.
    assert [(r["_step"], "loss" in r, "shardpack/samples_per_s" in r) for r in rows] == [
        (10, True, True), (20, True, True), (30, True, True)]
    assert mon.stats()["sink_errors"] == {}


def test_wandb_without_a_run_is_counted_not_fatal(caplog):
    wandb = pytest.importorskip("wandb", reason="pip install wandb")
    if wandb.run is not None:
        pytest.skip("a W&B run is active in this process")
    caplog.set_level(logging.WARNING, logger=monitor_mod.__name__)
    mon, seen = run_monitor([WandbSink()], intervals=2)
    assert mon.stats()["sink_errors"] == {"wandb": 2} and len(seen) == 2
    assert "wandb.init()" in caplog.records[0].getMessage()


def test_missing_backends_say_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_backends(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "tensorboardX", "wandb", "prometheus_client"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_backends)
    for make, words in ((lambda: TensorBoardSink("x"), "tensorboardX"),
                        (lambda: WandbSink(), "pip install wandb"),
                        (lambda: PrometheusSink(0), "pip install prometheus-client")):
        with pytest.raises(ImportError, match=words) as info:
            make()
        assert "shardpack[monitor]" in str(info.value)
