"""The data path: what is written is what the manifest says, checked on the way back in."""

from __future__ import annotations

import os
import zlib

import pytest

from slurm_preempt.job import checkpoint_io
from slurm_preempt.job.checkpoint_io import (
    CHUNK,
    OVERLAP_MIN,
    Damaged,
    DurableWriter,
    checksum_path,
    copy_file,
    map_file,
    read_checked,
    verify_file,
    write_file,
)

SIZES = [0, 1, OVERLAP_MIN - 1, OVERLAP_MIN, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345]


def _entry(data: bytes) -> dict:
    return {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}


@pytest.mark.parametrize("size", SIZES)
def test_written_file_and_its_entry_match_the_bytes(tmp_path, size):
    data = os.urandom(size)
    entry = write_file(tmp_path / "f", [data])
    assert entry == _entry(data)
    assert (tmp_path / "f").read_bytes() == data
    assert checksum_path(tmp_path / "f") == (entry["bytes"], entry["crc32"])
    assert read_checked(tmp_path / "f", entry) == data
    verify_file(tmp_path / "f", entry)


def test_many_pieces_of_mixed_sizes_checksum_as_one_stream(tmp_path):
    pieces = [os.urandom(n) for n in (10, OVERLAP_MIN + 7, 3, CHUNK + 5, 0, 100)]
    entry = write_file(tmp_path / "f", [bytearray(pieces[0]), memoryview(pieces[1]), *pieces[2:]])
    assert entry == _entry(b"".join(pieces))


def test_a_streaming_writer_is_file_like_enough_for_a_serializer(tmp_path):
    writer = DurableWriter(tmp_path / "f")
    assert writer.writable() and writer.tell() == 0
    writer.write(b"head")
    writer.write(memoryview(os.urandom(2 * OVERLAP_MIN)).toreadonly())
    writer.flush()
    entry = writer.finish()
    assert entry["bytes"] == writer.tell() == 4 + 2 * OVERLAP_MIN
    assert entry == _entry((tmp_path / "f").read_bytes())


def test_an_existing_file_is_never_overwritten(tmp_path):
    (tmp_path / "f").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "f", [b"new"])
    assert (tmp_path / "f").read_bytes() == b"keep"


def test_copy_checksums_what_it_wrote(tmp_path):
    data = os.urandom(CHUNK + 99)
    (tmp_path / "src").write_bytes(data)
    assert copy_file(tmp_path / "src", tmp_path / "dst") == _entry(data)
    assert (tmp_path / "dst").read_bytes() == data


@pytest.mark.parametrize("size", [100, 2 * CHUNK])
@pytest.mark.parametrize("damage", ["flip", "truncate", "grow"])
def test_damage_is_found_on_the_way_in(tmp_path, size, damage):
    data = os.urandom(size)
    entry = write_file(tmp_path / "f", [data])
    changed = bytearray(data)
    if damage == "flip":
        changed[size // 2] ^= 1
    elif damage == "truncate":
        del changed[-1]
    else:
        changed += b"x"
    (tmp_path / "f").write_bytes(changed)
    with pytest.raises(Damaged):
        read_checked(tmp_path / "f", entry)
    with pytest.raises(Damaged):
        verify_file(tmp_path / "f", entry)


def test_missing_files_and_entries_are_damage_not_crashes(tmp_path):
    with pytest.raises(Damaged):
        read_checked(tmp_path / "missing", {"bytes": 1, "crc32": "00000000"})
    with pytest.raises(Damaged):
        verify_file(tmp_path / "missing", {"bytes": 1, "crc32": "00000000"})
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(Damaged):
        verify_file(tmp_path / "f", "not an entry")


def test_a_mapping_is_private_and_writable(tmp_path):
    (tmp_path / "f").write_bytes(b"abc" * 5000)
    mapped = map_file(tmp_path / "f")
    mapped[0:3] = b"xyz"
    assert bytes(mapped[0:3]) == b"xyz"
    assert (tmp_path / "f").read_bytes()[:3] == b"abc"  # copy-on-write: the file is as saved
    (tmp_path / "empty").write_bytes(b"")
    assert map_file(tmp_path / "empty") == b""


def test_every_step_is_announced_to_the_hook(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(checkpoint_io, "step_hook", seen.append)
    write_file(tmp_path / "f", [os.urandom(2 * CHUNK + 1)])
    assert seen == ["create f", "write f", "write f", "write f", "fsync f"]


def test_a_streamed_buffer_may_change_as_soon_as_write_returns(tmp_path):
    """torch.save reuses or frees what it handed to write(): the checksum must have read it by then."""
    writer = DurableWriter(tmp_path / "f")
    buffer = bytearray(os.urandom(4 * OVERLAP_MIN))
    expected = bytes(buffer)
    writer.write(buffer)
    buffer[:] = bytes(len(buffer))
    assert writer.finish() == _entry(expected)
    assert (tmp_path / "f").read_bytes() == expected
