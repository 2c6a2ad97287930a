"""The cost of recording an attempt: rank 0's software record and its attempts.json entry, per attempt
and per checkpoint, in CPU time of a fresh process (no collective: rank 0 writes, nobody waits).

    python -m bench --only software-record

Each case runs in its own interpreter (python -m bench.software_record CASE TASK_DIR CACHE_DIR), after
`import hpc.rundir.attempts`, and measures the CPU time (time.process_time) of one attempt's record:
the software record (the site folders listed, torch's version.py read, the driver and GPU from
/proc, the packages' digest), begin(), one first step, one checkpoint's entry, and the end.
"without torch" is how a `run` stage's wrapper meets it (hpc.scripts.runner), "torch loaded" how
hpc's training loop does (torch imported already, its own answers read). Beside it, the CPU of one torch.save of a 1 MiB
state into the same folder: the order of a small checkpoint's own cost. Last, one notification per
event (hpc.rundir.notify): the CPU its sender spends in send() (the claim on disk, a thread started)
and the wall time until an HTTP server on 127.0.0.1 has it, which the job does not wait for. And the
container image's content stamp (hpc.rundir.imagestamp), a part of the software record inside a
container: on a 2 GiB image file, from disk (its pages dropped first) and cached, per attempt and
what it comes to at 1000 tasks.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.common import Context, median, run_child
from bench.report import Section

TARGET_MS = 50.0
REPEATS = 5
CASES = ("without torch", "torch loaded")


def child(case: str, task_dir: str) -> None:
    """One attempt's record in this process: its CPU time, and one checkpoint entry's on its own."""
    from bench.common import emit

    if case == "torch loaded":
        import torch  # noqa: F401  (as in a training loop: loaded before the record)
    from hpc.rundir import attempts

    t0 = time.process_time()
    log = attempts.AttemptLog(Path(task_dir), True, "1", 0)
    log.start()
    log.first_step()
    t1 = time.process_time()
    log.saved(1, 0.01)
    t2 = time.process_time()
    log.ended("completed", 1)
    t3 = time.process_time()
    out = {"attempt_ms": (t3 - t0) * 1000, "save_entry_ms": (t2 - t1) * 1000}
    if case == "torch loaded":
        import torch

        state = {"w": torch.zeros(2**18)}
        t4 = time.process_time()
        torch.save(state, Path(task_dir) / "small.pt")
        out["torch_save_ms"] = (time.process_time() - t4) * 1000
    emit(out)


def notify_child(task_dir: str) -> None:
    """One notification in this process: the CPU its sender spends in send() (the claim on disk and
    the thread's start), and the wall time until a local HTTP server has the message."""
    import http.server
    import json
    import threading

    from bench.common import emit

    got = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            got.set()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    run = Path(task_dir)
    (run / "train").mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text("{}")
    (run / "config.yaml").write_text(json.dumps({"notify": {"webhook": f"http://127.0.0.1:{server.server_address[1]}/"}}))
    from hpc.rundir import notify

    t0, w0 = time.process_time(), time.perf_counter()
    notify.send(run / "train", "requeued", "train-1-0", "preempt: requeued", "train")
    t1 = time.process_time()
    got.wait(10)
    emit({"send_ms": (t1 - t0) * 1000, "delivered_ms": (time.perf_counter() - w0) * 1000})


IMAGE_GIB = 2  # the image the stamp is measured on; its cost does not grow with the size


def image_child(path: str) -> None:
    """The container image's content stamp (hpc.rundir.imagestamp) in this process, its pages first
    dropped from the page cache (posix_fadvise DONTNEED: this file's alone), then again warm: the CPU
    and wall time of each, and the bytes it read."""
    import os

    from bench.common import emit
    from hpc.rundir import imagestamp

    out = {}
    for case in ("cold", "warm"):
        if case == "cold":
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        t0, w0 = time.process_time(), time.perf_counter()
        found = imagestamp.stamp(path)
        out[f"{case}_cpu_ms"] = (time.process_time() - t0) * 1000
        out[f"{case}_wall_ms"] = (time.perf_counter() - w0) * 1000
    emit({**out, "stamp": found, "read_bytes": imagestamp.SAMPLES * imagestamp.BLOCK})


def image_rows(sec: Section, base: Path, repeats: int) -> None:
    """A row for the image's stamp: a squashfs-like file of IMAGE_GIB GiB, per attempt and at 1000 tasks."""
    image = base / "image.sqsh"
    if not image.exists():
        chunk = b"hsqs" + os.urandom((1 << 20) - 4)
        with open(image, "wb") as f:
            for _ in range(IMAGE_GIB << 10):
                f.write(chunk)
    found = [run_child("software_record", ["image", str(image)]) for _ in range(repeats)]
    cold, warm = median([x["cold_wall_ms"] for x in found]), median([x["warm_wall_ms"] for x in found])
    cpu = median([x["cold_cpu_ms"] for x in found])
    import hashlib

    t0 = time.perf_counter()  # beside it, once: a full sha256 of the same image, cached
    with open(image, "rb") as f:
        hashlib.file_digest(f, "sha256")
    whole_s = time.perf_counter() - t0
    sec.rows.append([f"the image's content stamp ({IMAGE_GIB} GiB file, {found[0]['read_bytes'] >> 20} MiB sampled)",
                     f"{cpu:.1f} ms CPU, {cold:.1f} ms wall from disk", f"{warm:.1f} ms wall when cached",
                     f"{cpu / TARGET_MS:.2f}x"])
    sec.notes.append(f"the image's stamp at 1000 tasks: {cold:.1f} ms x 1000 = {cold:.1f} s of wall summed from "
                     f"disk (each task's rank 0 once per attempt, side by side on their nodes, not in series), "
                     f"{found[0]['read_bytes'] * 1000 / 2**30:.1f} GiB read in all against "
                     f"{IMAGE_GIB * 1000} GiB for a full hash per task; a sha256 of the whole image, cached, took "
                     f"{whole_s:.1f} s here")
    sec.verdicts.append((f"the image's content stamp: {cpu:.1f} ms of CPU per attempt (target {TARGET_MS:g} ms)",
                         cpu <= TARGET_MS))


def run(ctx: Context) -> Section:
    sec = Section("software-record", "Recording an attempt: software record and attempts.json; a notification",
                  f"at most {TARGET_MS:g} ms of CPU per attempt on rank 0, no collective",
                  "python -m bench --only software-record" + (" --quick" if ctx.quick else ""),
                  headers=["case", "CPU per attempt (median)", "per checkpoint entry", "x target"])
    base = ctx.scratch("software-record")
    repeats = 2 if ctx.quick else REPEATS
    saves = []
    for case in CASES:
        attempt_ms, entry_ms = [], []
        for n in range(repeats):
            task = base / f"task-{case.replace(' ', '-')}-{n}"
            task.mkdir(parents=True, exist_ok=True)
            found = run_child("software_record", [case, str(task)])
            attempt_ms.append(found["attempt_ms"])
            entry_ms.append(found["save_entry_ms"])
            saves += [found["torch_save_ms"]] if "torch_save_ms" in found else []
        took = median(attempt_ms)
        sec.rows.append([case, f"{took:.1f} ms", f"{median(entry_ms):.2f} ms", f"{took / TARGET_MS:.2f}x"])
        sec.verdicts.append((f"{case}: {took:.1f} ms of CPU per attempt (target {TARGET_MS:g} ms)", took <= TARGET_MS))
    if saves:
        sec.notes.append(f"beside it: torch.save of a 1 MiB state costs {median(saves):.1f} ms of CPU here")
    sent = [run_child("software_record", ["notify", str(base / f"notify-{n}")]) for n in range(repeats)]
    sec.rows.append(["a notification (webhook, 127.0.0.1)", f"{median([x['send_ms'] for x in sent]):.1f} ms in send()",
                     f"delivered in {median([x['delivered_ms'] for x in sent]):.0f} ms (wall, in the background)", "-"])
    image_rows(sec, base, repeats)
    sec.notes += [f"median of {repeats} fresh processes per case; no collective in any case (rank 0 writes "
                  "<task>/attempts.json, the other ranks hold a record that does nothing)",
                  "the packages' digest is over the .dist-info names of the site folders (one listing each): "
                  "importlib.metadata's distributions() parsed every METADATA file in 70-80 ms here"]
    return sec


if __name__ == "__main__":
    {"notify": lambda: notify_child(sys.argv[2]), "image": lambda: image_child(sys.argv[2])}.get(
        sys.argv[1], lambda: child(*sys.argv[1:3]))()
