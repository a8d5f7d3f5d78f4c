"""The data path: what is written is what the manifest says, checked on the way back in."""

from __future__ import annotations

import os
import zlib

import pytest

from slurm_preempt.job import checkpoint_io, checksum
from slurm_preempt.job.checkpoint_io import (
    CHUNK,
    OVERLAP_MIN,
    Damaged,
    DurableWriter,
    copy_file,
    file_entry,
    read_view,
    verify_file,
    write_file,
)

SIZES = [0, 1, OVERLAP_MIN - 1, OVERLAP_MIN, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345]


def _entry(data: bytes) -> dict:
    return checksum.of(data)


def _crc32_entry(data: bytes) -> dict:
    return {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}


@pytest.mark.parametrize("size", SIZES)
def test_written_file_and_its_entry_match_the_bytes(tmp_path, size):
    data = os.urandom(size)
    entry = write_file(tmp_path / "f", [data])
    assert entry == _entry(data)
    assert (tmp_path / "f").read_bytes() == data
    assert file_entry(tmp_path / "f") == entry
    assert read_view(tmp_path / "f", entry) == data
    verify_file(tmp_path / "f", entry)


@pytest.mark.parametrize("size", [0, 100, 2 * CHUNK + 1])
def test_files_checksummed_with_crc32_by_an_older_release_still_verify(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    old = _crc32_entry(data)
    assert file_entry(tmp_path / "f", checksum.CRC32) == old
    verify_file(tmp_path / "f", old)
    assert read_view(tmp_path / "f", old) == data
    with pytest.raises(Damaged):
        verify_file(tmp_path / "f", {**old, "crc32": "00000000" if old["crc32"] != "00000000" else "1"})


def test_the_default_checksum_is_named_in_each_entry(tmp_path):
    entry = write_file(tmp_path / "f", [b"abc"])
    assert set(entry) == {"bytes", checksum.DEFAULT} and checksum.DEFAULT == checksum.XXH3
    with pytest.raises(Damaged, match="no known checksum"):
        verify_file(tmp_path / "f", {"bytes": 3, "sha0": "x"})


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
        read_view(tmp_path / "f", entry)
    with pytest.raises(Damaged):
        verify_file(tmp_path / "f", entry)


def test_missing_files_and_entries_are_damage_not_crashes(tmp_path):
    with pytest.raises(Damaged):
        read_view(tmp_path / "missing", {"bytes": 1, "crc32": "00000000"})
    with pytest.raises(Damaged):
        verify_file(tmp_path / "missing", {"bytes": 1, "crc32": "00000000"})
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(Damaged):
        verify_file(tmp_path / "f", "not an entry")


def test_a_view_is_read_only_and_a_writable_one_is_a_copy(tmp_path):
    data = b"abc" * 5000
    entry = write_file(tmp_path / "f", [data])
    view = read_view(tmp_path / "f", entry)
    assert isinstance(view, memoryview) and view.readonly and view == data
    copy = read_view(tmp_path / "f", entry, writable=True)
    copy[0:3] = b"xyz"
    assert bytes(copy[0:3]) == b"xyz" and (tmp_path / "f").read_bytes() == data
    empty = write_file(tmp_path / "empty", [b""])
    assert read_view(tmp_path / "empty", empty) == b""


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
