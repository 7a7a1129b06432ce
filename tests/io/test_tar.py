"""io/tar.py: a tar's members read from its headers, one at a time and all at once, against
what ``tarfile`` itself reads (archives written by ``tarfile`` in every format)."""

from __future__ import annotations

import io
import tarfile

import pytest

from zephon_columnar.io import tar as tar_headers


def write(path, names, tar_format=tarfile.PAX_FORMAT):
    with tarfile.open(path, "w", format=tar_format) as archive:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            payload = f"payload {i}".encode() * (1 + 60 * i)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
        archive.addfile(tarfile.TarInfo("folder"))  # no data: not a member of any sample


def tarfile_members(path):
    with tarfile.open(path) as archive:
        return [(m.name, m.offset_data, m.size) for m in archive if m.isfile()]


def at_once(path):
    found = tar_headers.members_at_once(str(path), path.stat().st_size)
    return None if found is None else list(zip(found[0].to_pylist(), found[1].tolist(), found[2].tolist()))


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_headers_are_read_as_tarfile_reads_them_long_names_too(tmp_path, tar_format):
    names = ["a.txt", "dir/b.txt", "x" * 90 + "/" + "long" * 30 + ".txt", "naïve/c.json"]
    if tar_format == tarfile.USTAR_FORMAT:
        names[2] = "x" * 90 + "/" + "short" * 4 + ".txt"  # ustar splits a long path into prefix and name
    path = tmp_path / "t.tar"
    write(path, names, tar_format)
    expected = tarfile_members(path)
    assert list(tar_headers.members(str(path), path.stat().st_size)) == expected
    assert at_once(path) is None  # a name prefix, a GNU long name or a pax path: one at a time
    without_end = path.read_bytes()[: expected[-1][1] + -(-expected[-1][2] // 512) * 512]
    path.write_bytes(without_end)  # a tar may stop after its last member's padding
    assert list(tar_headers.members(str(path), path.stat().st_size)) == expected


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_plain_archive_is_read_at_once_as_tarfile_reads_it(tmp_path, tar_format):
    path = tmp_path / "t.tar"
    write(path, ["a.txt", "dir/b.txt", "./c.json", "d.input_ids.npy"], tar_format)
    assert at_once(path) == tarfile_members(path)
    whole = path.read_bytes()
    end = tarfile_members(path)[-1]
    path.write_bytes(whole[: end[1] + -(-end[2] // 512) * 512])  # no end-of-archive blocks
    assert at_once(path) == tarfile_members(path)


def test_a_damaged_archive_is_left_to_the_walk_that_names_the_fault(tmp_path):
    path = tmp_path / "t.tar"
    write(path, ["a.txt", "b.txt", "c.txt"])
    whole = path.read_bytes()
    (b_header,) = [offset - 512 for name, offset, _ in tarfile_members(path) if name == "b.txt"]
    damaged = {
        "cut": whole[: b_header + 512 + 100],
        "bad checksum": whole[: b_header + 100] + b"Z" + whole[b_header + 101 :],
        "data after the end": whole + b"\x01" * 512,
    }
    faults = {
        "cut": f"a member at byte {b_header} ends past the file.s end",
        "bad checksum": f"a bad header checksum at byte {b_header}",
        "data after the end": "data after the end-of-archive marker",
    }
    for what, data in damaged.items():
        path.write_bytes(data)
        assert at_once(path) is None, what
        with pytest.raises(tarfile.ReadError, match=faults[what]):
            list(tar_headers.members(str(path), len(data)))
