"""The checkpoint store: complete or invisible, verified, falls back, keeps K, saves in the background."""

from __future__ import annotations

import gc
import json
import os
import random
import select
import signal
import socket
import statistics
import subprocess
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from apisurface import actual, documented
from iostats import disk_bytes_read, forget_cached
from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.checkpoint import MANIFEST, CheckpointStore, step_name
from slurm_preempt.job.snapshot import snapshot_of


class Warnings(list):
    def __call__(self, message):
        self.append(message)


@pytest.fixture
def warned():
    return Warnings()


def _step_and_payload(store: CheckpointStore):
    """The newest intact checkpoint's step and payload, or None (what these tests compare)."""
    found = store.restore()
    return None if found is None else (found[0].step, found[1])


def test_first_run_has_no_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path / "none")
    assert store.latest() is None
    assert _step_and_payload(store) is None


def test_bytes_files_objects_and_paths_round_trip(tmp_path):
    store = CheckpointStore(tmp_path, keep=10)
    store.save(1, b"raw bytes")
    store.save(2, {"model.bin": b"m" * 1000, "opt.bin": bytearray(b"o" * 10)})
    state = {"step": 3, "weights": bytearray(os.urandom(100_000)), "names": ["a", "b"]}
    store.save(3, state)
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "x.txt").write_text("x")
    (tmp_path / "state.txt").write_text("42")
    store.save_paths(4, [tmp_path / "state.txt", tmp_path / "src"])

    assert store.open(1).load() == b"raw bytes"
    assert store.open(2).load() == {"model.bin": b"m" * 1000, "opt.bin": b"o" * 10}
    assert store.open(3).load() == state
    latest = store.latest()
    assert latest.step == 4
    assert (latest.path / "state.txt").read_text() == "42"
    assert (latest.path / "src" / "sub" / "x.txt").read_text() == "x"
    assert set(latest.manifest["files"]) == {"state.txt", "src/sub/x.txt"}


def test_keeps_the_last_k(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 6):
        store.save(step, str(step).encode())
    store.settle()  # pruning runs after the save returned, on a helper thread
    assert store.steps() == [4, 5]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(7, b"first")
    store.save(7, b"second")
    assert _step_and_payload(store) == (7, b"second")


def test_meta_is_kept_in_the_manifest(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, b"x", meta={"num_nodes": 2})
    manifest = json.loads((tmp_path / step_name(1) / MANIFEST).read_text())
    assert manifest["meta"] == {"num_nodes": 2}
    assert manifest["files"]["data.bin"]["bytes"] == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_manifest", "delete_file", "garble_manifest"])
def test_damaged_newest_falls_back_with_a_warning(tmp_path, warned, damage):
    store = CheckpointStore(tmp_path, keep=5, warn=warned)
    store.save(1, {"a.bin": b"a" * 5000, "b.bin": b"b" * 5000})
    store.save(2, {"a.bin": b"A" * 5000, "b.bin": b"B" * 5000})
    newest = tmp_path / step_name(2)
    if damage == "flip":
        data = bytearray((newest / "b.bin").read_bytes())
        data[1234] ^= 0x01
        (newest / "b.bin").write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(newest / "a.bin", 100)
    elif damage == "delete_manifest":
        (newest / MANIFEST).unlink()
    elif damage == "delete_file":
        (newest / "a.bin").unlink()
    else:
        (newest / MANIFEST).write_text('{"step": 2, "fil')
    found = store.latest()
    assert found.step == 1
    assert found.load() == {"a.bin": b"a" * 5000, "b.bin": b"b" * 5000}
    assert len(warned) == 1 and step_name(2) in warned[0] and "damaged" in warned[0]


def test_every_checkpoint_damaged_means_none(tmp_path, warned):
    store = CheckpointStore(tmp_path, warn=warned)
    store.save(1, b"x")
    (tmp_path / step_name(1) / "data.bin").write_bytes(b"y")
    assert store.latest() is None
    assert len(warned) == 1


def test_async_save_snapshots_at_call_time(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    state = {"w": bytearray(b"1" * 1_000_000)}
    store.save(1, state, background=True)
    state["w"][:] = b"2" * 1_000_000  # the caller goes on training while the save runs
    store.save(2, state, background=True)  # one save in flight: this waits for the first
    store.wait()
    assert store.open(1).load()["w"] == b"1" * 1_000_000
    assert store.open(2).load()["w"] == b"2" * 1_000_000


def test_async_error_surfaces_on_the_next_call(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = CheckpointStore(blocker / "ckpt")
    store.save(1, b"x", background=True)  # fails in the background
    with pytest.raises(CheckpointError, match="background save failed"):
        store.save(2, b"y", background=True)
    store.wait()  # the error was reported once, not again


def test_bad_names_are_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError):
        store.save(1, {"../escape": b"x"})
    with pytest.raises(CheckpointError):
        store.save_paths(1, [tmp_path / "missing"])


def test_leftovers_of_dead_savers_are_swept(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, b"x")
    child = subprocess.Popen(["true"])
    child.wait()
    stale = tmp_path / f".tmp-{socket.gethostname().split('.')[0]}-{child.pid}-2-1"  # an older version's name
    stale.mkdir()
    (stale / "data.bin").write_bytes(b"half")
    CheckpointStore(tmp_path).save(2, b"y")
    assert not stale.exists()


# ------------------------------------------------------------------------------ SIGKILL at random points


def _payload(step: int, seq: int) -> dict:
    return {"a.bin": bytes([seq % 251]) * 40_000, "b.bin": f"{step}:{seq}".encode() * 500}


def _saver(directory, step: int, seq: int, rng: random.Random, out: int) -> None:
    """Save forever, 30% of the saves re-saving the step just saved; report each save that returned,
    with the seconds it took."""
    store = CheckpointStore(directory, keep=3)
    while True:
        if rng.random() < 0.7:
            step += 1
        began = time.monotonic()
        store.save(step, _payload(step, seq), meta={"seq": seq})
        os.write(out, f"{step} {seq} {time.monotonic() - began:.6f}\n".encode())
        seq += 1


class _SaveReports:
    """The lines a saver writes, read as they come; a hung saver ends the test, a slow one only waits."""

    HUNG = 60.0  # seconds without a line: only a hung test, never a slow machine, gets here

    def __init__(self, fd: int):
        self.fd, self.buffer, self.lines = fd, b"", []

    def _read(self) -> bool:
        chunk = os.read(self.fd, 65536)
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        self.lines += [line.decode().split() for line in complete]
        return bool(chunk)

    def wait_for(self, count: int) -> None:
        while len(self.lines) < count:
            ready, _, _ = select.select([self.fd], [], [], self.HUNG)
            assert ready, f"no save returned within {self.HUNG} s"
            assert self._read(), "the saver ended by itself"

    def drain(self) -> list[tuple[int, int]]:
        while self._read():
            pass
        os.close(self.fd)
        return [(int(step), int(seq)) for step, seq, _ in self.lines]


def test_thousands_of_random_kills_with_resaves_never_lose_the_last_save(tmp_path, warned):
    """2,000 savers SIGKILLed at random moments, 30% of their saves re-saving a step: restore always
    finds a complete, verified checkpoint at least as new as the last save that returned.

    Where the kills land does not depend on the machine's speed: each trial waits until its saver has
    returned 0-3 saves (drawn), then kills it a random fraction of one save's measured duration later,
    so a busy machine makes the test slower, never thinner."""
    rng = random.Random(16)
    directory = tmp_path / "ckpt"
    CheckpointStore(directory).save(0, _payload(0, 0), meta={"seq": 0})
    step, seq, returned, resaves = 0, 1, 0, 0
    restored = (0, 0)  # (step, seq) found after the previous kill
    save_seconds = [0.002]  # durations the savers reported; their median paces the kill
    for trial in range(2000):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                _saver(directory, step, seq, random.Random(trial), write_end)
            finally:
                os._exit(0)
        os.close(write_end)
        reports = _SaveReports(read_end)
        reports.wait_for(rng.randrange(4))
        time.sleep(rng.uniform(0, statistics.median(save_seconds[-200:])))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        done = reports.drain()
        save_seconds += [float(line[2]) for line in reports.lines]
        last = done[-1] if done else restored
        resaves += sum(a[0] == b[0] for a, b in zip(done, done[1:], strict=False))
        returned += len(done)
        found = CheckpointStore(directory, warn=warned).latest()
        assert found is not None, f"trial {trial}: restore found nothing"
        assert (found.step, found.meta["seq"]) >= last, f"trial {trial}: older than the last returned save"
        assert found.load() == _payload(found.step, found.meta["seq"])
        restored = (found.step, found.meta["seq"])
        step, seq = found.step, max(seq, last[1]) + 2  # the killed save may have used last + 1
    print(f"{returned} saves returned before the kills, {resaves} re-saves, last step {step}")
    assert warned == [], f"a torn checkpoint was visible: {warned[:3]}"
    # Kills landed all over many saves; by construction ~3,000 saves returned, ~1,000 pairs re-saved.
    assert returned > 100 and resaves > 10 and step > 50


# ------------------------------------------------------------------------------ disk full


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False, capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        # A failed save's traceback (kept by pytest) may still hold a file open there: collect it,
        # and detach lazily if the mount is still busy, so no run leaves a mount behind.
        gc.collect()
        if subprocess.run(["umount", str(mount)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_is_a_clear_error_and_the_previous_checkpoint_survives(small_tmpfs):
    store = CheckpointStore(small_tmpfs / "ckpt", keep=3)
    store.save(1, os.urandom(300_000))
    before = store.open(1).load()
    with pytest.raises(CheckpointError, match="disk full") as caught:
        store.save(2, os.urandom(900_000))
    assert step_name(1) in str(caught.value) and "intact" in str(caught.value)
    assert _step_and_payload(store) == (1, before)
    assert os.listdir(small_tmpfs / "ckpt") == [step_name(1)]  # no half-written leftovers
    store.save(3, b"small")  # space is back once the failed save is cleaned up
    assert store.latest().step == 3


def test_disk_full_in_the_background_surfaces_on_the_next_call(small_tmpfs):
    store = CheckpointStore(small_tmpfs / "ckpt")
    store.save(1, b"ok")
    store.save(2, bytearray(2_000_000), background=True)
    with pytest.raises(CheckpointError, match="disk full"):
        store.wait()
    assert store.latest().step == 1


def test_checkpoint_paths_are_plain_folders(tmp_path):
    store = CheckpointStore(tmp_path)
    found = store.save(12, b"x")
    assert found.path == Path(tmp_path) / "step-000000000012"
    assert found.nbytes == 1


def test_saving_an_older_step_warns(tmp_path, warned):
    store = CheckpointStore(tmp_path, warn=warned)
    store.save(10, b"x")
    store.save(1, b"y")
    assert "holds step 10" in warned[0]
    assert store.latest().step == 10


def test_files_in_subfolders_round_trip(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"model/a.bin": b"a" * 10, "b.bin": b"b"})
    assert _step_and_payload(store) == (1, {"model/a.bin": b"a" * 10, "b.bin": b"b"})


def test_loading_an_unverified_damaged_checkpoint_is_an_error(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, b"x" * 100)
    (tmp_path / step_name(1) / "data.bin").write_bytes(b"y" * 100)
    with pytest.raises(CheckpointError, match="damaged"):
        store.open(1).load()


def test_restored_numpy_arrays_are_read_only_views_and_writable_ones_copies(tmp_path):
    np = pytest.importorskip("numpy")
    store = CheckpointStore(tmp_path)
    store.save(1, {"w": np.arange(1_000_000, dtype=np.float32), "bias": np.ones(3)})
    _found, state = store.restore()
    assert not state["w"].flags.writeable and not state["w"].flags.owndata  # over the mapped file
    _found, state = store.restore(writable=True)
    assert state["w"].flags.writeable and state["bias"].flags.writeable
    state["w"][0] = 42.0  # training goes on in the restored arrays
    assert store.restore()[1]["w"][0] == 0.0
    assert store.latest() is not None


MiB = 1 << 20


def _peak_python_allocation(action) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "files", "numpy"])
def test_a_synchronous_save_writes_the_callers_buffers_without_copying_them(tmp_path, kind):
    big = bytearray(os.urandom(16 * MiB))
    if kind == "numpy":
        np = pytest.importorskip("numpy")
        payload = {"weights": np.frombuffer(big, dtype=np.float32), "step": 3}
    else:
        payload = {"bytes": bytes(big), "bytearray": big, "files": {"a.bin": big, "b.bin": bytes(big)}}[kind]
    store = CheckpointStore(tmp_path)
    peak = _peak_python_allocation(lambda: store.save(1, payload))
    assert peak < 2 * MiB, f"saving 16 MiB allocated {peak / MiB:.1f} MiB in Python"
    _found, loaded = store.restore()
    if kind == "numpy":
        assert loaded["weights"].tobytes() == bytes(big) and loaded["step"] == 3
    else:
        assert loaded == payload


@pytest.mark.parametrize("kind", ["bytes", "files", "numpy"])
def test_loading_reads_each_byte_from_the_disk_once(tmp_path, kind):
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io here")
    payload = {
        "bytes": os.urandom(16 * MiB),
        "files": {"a.bin": os.urandom(16 * MiB), "b.bin": bytes(MiB)},
    }.get(kind)
    if kind == "numpy":
        np = pytest.importorskip("numpy")
        payload = {"a": np.frombuffer(os.urandom(16 * MiB), dtype=np.uint8), "b": np.zeros(MiB // 8)}
    store = CheckpointStore(tmp_path)
    found = store.save(1, payload)
    forget_cached(found.path)
    before = disk_bytes_read()
    _found, state = store.restore()
    read = disk_bytes_read() - before
    assert (
        sum(len(memoryview(v).cast("B")) for v in (state.values() if isinstance(state, dict) else [state]))
        > 0
    )
    assert found.nbytes <= read < found.nbytes + 2 * MiB, (
        f"read {read / MiB:.1f} MiB to load {found.nbytes / MiB:.1f}"
    )


# ------------------------------------------------------------------------------ the store's surface


def test_the_docs_list_the_whole_surface_of_the_store():
    listed, have = documented("The whole of `CheckpointStore`"), actual(CheckpointStore)
    assert listed["constructor"] == have["constructor"]
    assert sorted(listed["methods"] + listed["deprecated"]) == have["methods"]
    assert sorted(listed["read-only properties"]) == have["read-only properties"]


def test_a_background_save_returns_nothing_and_wait_returns_the_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.save(1, b"x", background=True) is None
    assert store.wait().step == 1 and store.latest().step == 1


def test_save_async_is_a_deprecated_alias_of_a_background_save(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.warns(DeprecationWarning, match=r"save_async\(\) is deprecated.*background=True"):
        assert store.save_async(1, {"w": b"1"}) is None
    assert store.wait().step == 1 and store.restore()[1] == {"w": b"1"}


def test_save_snapshot_async_is_a_deprecated_alias(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.warns(DeprecationWarning, match=r"save_snapshot_async\(\) is deprecated"):
        store.save_snapshot_async(2, snapshot_of(b"two"), {"note": "n"})
    found = store.wait()
    assert found.step == 2 and found.meta == {"note": "n"} and store.restore()[1] == b"two"


def test_load_latest_is_a_deprecated_alias_of_restore(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.warns(DeprecationWarning, match=r"load_latest\(\) is deprecated.*restore\(\)"):
        assert store.load_latest() is None
    store.save(3, b"three")
    with pytest.warns(DeprecationWarning):
        assert store.load_latest() == (3, b"three")
