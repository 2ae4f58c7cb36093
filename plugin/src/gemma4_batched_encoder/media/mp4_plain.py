"""Is an mp4 "plain": does its sample table alone say how many frames a decoder presents?

vLLM 0.27+ cross-checks a video's header frame count with an end-of-stream seek, which for a short
clip decodes the whole video a second time (`media/count_check.py`). The check exists for mp4 edit
lists that hide a decode lead-in, and corrects the count only when the seek ends more than one
frame short of the header's. This reads the container (no decoding, ~0.03 ms) and answers the
video track's sample count when nothing of that kind can happen:

- one video track, not fragmented (no `mvex`): the sample table is the whole stream;
- constant frame duration (one `stts` entry), so a frame's position is its timestamp over that
  duration (how OpenCV's FFmpeg backend numbers frames after a seek);
- no edit that hides frames: one edit at rate 1 whose start is the first frame's composition
  offset (what muxers write for B-frame delay) and that lasts the whole track, or no edit list
  and no B-frame delay;
- every sample's bytes inside the data (not truncated).

Otherwise None, and vLLM's check runs. The count is only half of the argument: the caller also
requires that its own sequential decode produced every frame up to the last (a decoder that drops
frames makes the seek end short too); see `count_check`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator


class NotPlain(Exception):
    """The container is not one this module can vouch for."""


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, box end) of each box in data[start:end]."""
    off = start
    while off + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, off)
        header = 8
        if size == 1:
            if off + 16 > end:
                raise NotPlain("truncated box header")
            (size,) = struct.unpack_from(">Q", data, off + 8)
            header = 16
        elif size == 0:
            size = end - off
        if size < header or off + size > end:
            raise NotPlain(f"box {kind!r} overruns its parent")
        yield kind, off + header, off + size
        off += size


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    for k, s, e in _boxes(data, start, end):
        if k == kind:
            return s, e
    return None


def _need(data: bytes, start: int, end: int, path: bytes) -> tuple[int, int]:
    for kind in path.split(b"/"):
        found = _child(data, start, end, kind)
        if found is None:
            raise NotPlain(f"no {kind!r}")
        start, end = found
    return start, end


def _full_box(data: bytes, start: int) -> tuple[int, int]:
    """(version, payload start after version + flags)."""
    return data[start], start + 4


def _table(data: bytes, start: int, end: int, fmt: str) -> list[tuple[int, ...]]:
    (count,) = struct.unpack_from(">I", data, start)
    size = struct.calcsize(fmt)
    if start + 4 + count * size > end:
        raise NotPlain("table overruns its box")
    return list(struct.iter_unpack(fmt, data[start + 4 : start + 4 + count * size]))


def _timescale(data: bytes, start: int) -> int:
    version, p = _full_box(data, start)
    # creation and modification times are 4 bytes each in version 0, 8 in version 1
    (scale,) = struct.unpack_from(">I", data, p + (8 if version == 0 else 16))
    if scale <= 0:
        raise NotPlain("zero timescale")
    return scale


def _video_tracks(data: bytes, moov: tuple[int, int]) -> list[tuple[int, int]]:
    tracks = []
    for kind, s, e in _boxes(data, *moov):
        if kind != b"trak":
            continue
        hs, _ = _need(data, s, e, b"mdia/hdlr")
        if data[hs + 8 : hs + 12] == b"vide":  # version/flags, pre_defined, handler_type
            tracks.append((s, e))
    return tracks


def _sample_sizes(data: bytes, stbl: tuple[int, int]) -> list[int]:
    s, e = _need(data, *stbl, b"stsz")
    _, p = _full_box(data, s)
    size, count = struct.unpack_from(">II", data, p)
    if size:
        if size * count > len(data):  # cannot all be inside (and no huge list from a bad count)
            raise NotPlain("stsz lists more bytes than the data holds")
        return [size] * count
    if p + 8 + 4 * count > e:
        raise NotPlain("stsz overruns its box")
    return list(struct.unpack_from(f">{count}I", data, p + 8))


def _chunk_offsets(data: bytes, stbl: tuple[int, int]) -> list[int]:
    found = _child(data, *stbl, b"stco")
    if found is not None:
        return [o for (o,) in _table(data, found[0] + 4, found[1], ">I")]
    found = _child(data, *stbl, b"co64")
    if found is None:
        raise NotPlain("no chunk offsets")
    return [o for (o,) in _table(data, found[0] + 4, found[1], ">Q")]


def _samples_inside(data: bytes, stbl: tuple[int, int], sizes: list[int]) -> bool:
    offsets = _chunk_offsets(data, stbl)
    s, e = _need(data, *stbl, b"stsc")
    runs = _table(data, s + 4, e, ">III")  # first_chunk (1-based), samples_per_chunk, desc index
    if not runs or runs[0][0] != 1:
        raise NotPlain("bad stsc")
    sample = 0
    for i, (first, per_chunk, _) in enumerate(runs):
        last = runs[i + 1][0] - 1 if i + 1 < len(runs) else len(offsets)
        for chunk in range(first - 1, last):
            chunk_sizes = sizes[sample : sample + per_chunk]
            if len(chunk_sizes) < per_chunk or offsets[chunk] + sum(chunk_sizes) > len(data):
                return False
            sample += per_chunk
    return sample == len(sizes)


def _first_composition_offset(data: bytes, stbl: tuple[int, int]) -> int:
    found = _child(data, *stbl, b"ctts")
    if found is None:
        return 0
    version, p = _full_box(data, found[0])
    rows = _table(data, p, found[1], ">Ii" if version else ">II")
    return rows[0][1] if rows else 0


def _edits_hide_nothing(
    data: bytes,
    trak: tuple[int, int],
    stbl: tuple[int, int],
    media_duration: int,
    media_scale: int,
    movie_scale: int,
) -> bool:
    found = _child(data, *trak, b"edts")
    elst = _child(data, *found, b"elst") if found is not None else None
    if elst is None:
        # no edit: only vouched for without a B-frame delay (untested timelines otherwise)
        return _first_composition_offset(data, stbl) == 0
    version, p = _full_box(data, elst[0])
    rows = _table(data, p, elst[1], ">QqhH" if version else ">IihH")
    if len(rows) != 1:
        return False
    segment, media_time, rate_int, rate_frac = rows[0]
    if (rate_int, rate_frac) != (1, 0) or media_time != _first_composition_offset(data, stbl):
        return False
    # the edit lasts the whole track (0 = to the end); compared exactly in integers
    return segment == 0 or segment * media_scale >= media_duration * movie_scale


def frame_count(data: bytes) -> int | None:
    """The video track's sample count if the mp4 is plain (module docstring), else None."""
    try:
        moov = _need(data, 0, len(data), b"moov")
        if _child(data, *moov, b"mvex") is not None:
            return None  # fragmented: samples live in moof boxes
        tracks = _video_tracks(data, moov)
        if len(tracks) != 1:
            return None
        trak = tracks[0]
        stbl = _need(data, *trak, b"mdia/minf/stbl")
        media_scale = _timescale(data, _need(data, *trak, b"mdia/mdhd")[0])
        movie_scale = _timescale(data, _need(data, *moov, b"mvhd")[0])
        s, e = _need(data, *stbl, b"stts")
        stts = _table(data, s + 4, e, ">II")
        sizes = _sample_sizes(data, stbl)
        if len(stts) != 1 or stts[0][1] == 0 or stts[0][0] != len(sizes) or not sizes:
            return None  # variable frame duration, or counts that disagree
        duration = stts[0][0] * stts[0][1]
        if not _edits_hide_nothing(data, trak, stbl, duration, media_scale, movie_scale):
            return None
        if not _samples_inside(data, stbl, sizes):
            return None
        return len(sizes)
    except (NotPlain, struct.error, IndexError):
        return None
