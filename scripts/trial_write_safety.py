"""Trials of the write side's promises, run as a user would hit them (not a test:
it takes minutes and counts outcomes over many random timings).

* **Concurrent packs**: two ``pack-dataset`` processes start at (almost) the same
  moment into one DST, with a random head start and random ``--overwrite``.
  Good: DST ends as exactly one of the two datasets, byte for byte, and each
  process either succeeded or failed with a clear message (another pack holds
  DST, or DST is already a dataset). Data loss: a process exited 0 and DST holds
  no complete dataset. Mix: DST's files are not exactly one source's dataset.
* **Kill during overwrite**: DST holds dataset A; ``pack-dataset B DST --overwrite``
  is killed with SIGKILL at a random moment. Good: DST is exactly A or exactly B,
  readable, while the killed pack leaves at most its staging folder; then
  ``--resume`` (or a rerun) ends with exactly B.

Usage: ``python -m scripts.trial_write_safety [--trials 100] [--images 240]``.
Prints the counts; exit status 1 if any trial lost or mixed data.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from formats import verify_dataset
from scripts.synth import make_image_folder

PACK = [sys.executable, "-m", "packer.cli"]
_OPTS = ["--quiet", "--shard-size", "200KB", "--workers", "1"]
_TRANSIENT = (".shardpack.lock",)


def files_of(root: Path) -> dict[str, bytes] | None:
    if not (root / "manifest.json").is_file():
        return None
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())
            if p.is_file() and p.name not in _TRANSIENT}


def run(src: Path, dst: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*PACK, str(src), str(dst), *_OPTS, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def reference(src: Path, where: Path) -> tuple[dict[str, bytes], float]:
    t0 = time.perf_counter()
    p = run(src, where)
    _, err = p.communicate()
    if p.returncode:
        sys.exit(f"reference pack failed: {err.decode()}")
    return files_of(where), time.perf_counter() - t0


def concurrent_trials(n: int, srcs, refs, scratch: Path, rng: random.Random) -> dict[str, int]:
    counts = {"trials": 0, "good": 0, "loss": 0, "mix": 0, "unclear_error": 0,
              "one_refused": 0, "both_ok": 0}
    clear = ("another pack (PID", "already a dataset")
    for t in range(n):
        dst = scratch / f"conc-{t}"
        procs = []
        order = [0, 1] if rng.random() < 0.5 else [1, 0]
        for i in order:
            extra = ["--overwrite"] if rng.random() < 0.5 else []
            procs.append((i, run(srcs[i], dst, *extra)))
            time.sleep(rng.uniform(0, 0.15))
        results = [(i, p.wait(), p.stderr.read().decode()) for i, p in procs]
        counts["trials"] += 1
        got = files_of(dst)
        ok = [i for i, rc, _ in results if rc == 0]
        for _, rc, err in results:
            if rc != 0 and not any(c in err for c in clear):
                counts["unclear_error"] += 1
                print(f"  trial {t}: unclear error: {err.strip()[-300:]}")
        counts["one_refused" if len(ok) == 1 else "both_ok"] += len(ok) in (1, 2)
        if got is None:
            counts["loss" if ok else "good"] += 1
            continue
        if got not in refs:
            counts["mix"] += 1
            print(f"  trial {t}: DST is neither dataset")
            continue
        problems = verify_dataset(dst)
        counts["good" if not problems else "mix"] += 1
        shutil.rmtree(dst)
    return counts


def kill_trials(n: int, srcs, refs, seconds: float, scratch: Path,
                rng: random.Random) -> dict[str, int]:
    counts = {"trials": 0, "old": 0, "new": 0, "neither": 0, "finished_after_resume": 0,
              "killed_before_exit": 0, "killed_mid_replace": 0,
              "leftover_cleaned_by_next_pack": 0, "leftover_stuck": 0}
    for t in range(n):
        dst = scratch / f"kill-{t}"
        shutil.copytree(scratch / "ref-a", dst)
        p = run(srcs[1], dst, "--overwrite")
        time.sleep(rng.uniform(0.05, seconds * 1.2))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            counts["killed_before_exit"] += 1
        p.wait()
        counts["trials"] += 1
        if (scratch / f".kill-{t}.shardpack-new").exists():
            counts["killed_mid_replace"] += 1  # the kill landed while the new one was built
        got = files_of(dst)
        if got == refs[0] and not verify_dataset(dst):
            counts["old"] += 1
        elif got == refs[1] and not verify_dataset(dst):
            counts["new"] += 1
        else:
            counts["neither"] += 1
            print(f"  trial {t}: DST is neither the old nor the new dataset")
            continue
        resumed = run(srcs[1], dst, "--resume") if got == refs[0] else None
        if resumed is not None:
            _, err = resumed.communicate()
            if resumed.returncode:  # nothing staged to resume: pack again
                again = run(srcs[1], dst, "--overwrite")
                _, err = again.communicate()
        if files_of(dst) == refs[1]:
            counts["finished_after_resume"] += 1
        else:
            print(f"  trial {t}: the rerun did not end with the new dataset: {err!r}")
        staging = [q.name for q in scratch.iterdir() if q.name.startswith(f".kill-{t}.")]
        if staging:  # a kill while the old folder was being deleted: the next pack ends it
            again = run(srcs[0], dst, "--overwrite")
            _, err = again.communicate()
            still = [q.name for q in scratch.iterdir() if q.name.startswith(f".kill-{t}.")]
            counts["leftover_cleaned_by_next_pack" if not still and again.returncode == 0
                   else "leftover_stuck"] += 1
            if still or again.returncode:
                print(f"  trial {t}: {staging} left, and the next pack: {err.decode()[-300:]}")
        shutil.rmtree(dst)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--images", type=int, default=1600, help="images per source")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    scratch = Path(tempfile.mkdtemp(prefix="shardpack-trials-"))
    try:
        srcs = []
        for k in (0, 1):
            src = scratch / f"src-{k}"
            make_image_folder(src, 4, args.images // 4, seed=k, min_side=64, max_side=96,
                              workers=os.cpu_count() or 1)
            srcs.append(src)
        ref_a, secs_a = reference(srcs[0], scratch / "ref-a")
        ref_b, secs_b = reference(srcs[1], scratch / "ref-b")
        print(f"sources: 2 x {args.images} images; one pack takes {secs_a:.2f} s / {secs_b:.2f} s")
        conc = concurrent_trials(args.trials, srcs, [ref_a, ref_b], scratch, rng)
        print("concurrent packs:   " + ", ".join(f"{k} {v}" for k, v in conc.items()))
        kill = kill_trials(args.trials, srcs, [ref_a, ref_b], max(secs_a, secs_b), scratch, rng)
        print("kill in overwrite:  " + ", ".join(f"{k} {v}" for k, v in kill.items()))
        bad = conc["loss"] + conc["mix"] + kill["neither"] + kill["leftover_stuck"]
        print(f"data loss or mix: {bad} of {conc['trials'] + kill['trials']} trials")
        return 1 if bad else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
