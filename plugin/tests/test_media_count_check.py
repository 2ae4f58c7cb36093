"""The frame-count check beside the decode (`media.count_check`): vLLM's real OpenCV loader gives
the same frames, metadata and indices with it as without, for short and long clips, sampled and
not, with frame recovery and an fps target; bad input fails with vLLM's own error; many videos
decoded at once in threads (vLLM's media pool) neither crash nor mix up; code this was not
written against is left alone."""

from __future__ import annotations

import fractions
import inspect
import io
import struct
import threading

import numpy as np
import pytest

import media as media_files
from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import count_check, mp4_plain, stages
from gemma4_batched_encoder.noise_media import noise
from slo_loadtest.media import write_h264

opencv = pytest.importorskip("vllm.multimodal.video_decoders.opencv")


@pytest.fixture
def installed():
    assert media.install()
    assert getattr(opencv.decode_opencv, "_gemma4_count_check", False)
    yield
    media.set_fast_path(media.fast_path_requested())


def load(data: bytes, **kwargs):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    frames, meta = VIDEO_LOADER_REGISTRY.load("opencv").load_bytes(data, **kwargs)
    return np.asarray(frames), meta


def both(data: bytes, **kwargs):
    media.set_fast_path(False)
    stock = load(data, **kwargs)
    media.set_fast_path(True)
    return stock, load(data, **kwargs)


@pytest.mark.parametrize(
    ("frames", "width", "height", "fourcc", "kwargs"),
    [
        (6, 854, 480, "mp4v", {"num_frames": 32}),  # the SLO's clip: every frame
        (40, 320, 240, "mp4v", {"num_frames": 8}),  # sampled
        (40, 320, 240, "mp4v", {"num_frames": 32, "fps": 1}),  # an fps target
        (25, 160, 120, "mp4v", {"num_frames": 6, "frame_recovery": True}),
        (8, 640, 360, "VP90", {"num_frames": 32}),
        (3, 97, 55, "VP90", {"num_frames": -1}),
    ],
)
def test_same_frames_metadata_and_indices(installed, frames, width, height, fourcc, kwargs):
    data = media_files.mp4_bytes(frames, width, height, seed=frames, fourcc=fourcc)
    (stock, stock_meta), (fast, fast_meta) = both(data, **kwargs)
    assert stock.dtype == np.uint8 and stock.shape[0] >= 1
    assert np.array_equal(stock, fast)
    assert stock_meta == fast_meta  # includes the sampled frame indices and the source's count


def test_the_overlapped_decode_is_what_answers(installed):
    """Not vLLM's decode behind a swallowed error: the overlapped path itself returns the
    result, equal to vLLM's own `decode_opencv` field by field."""
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    loader_cls = VIDEO_LOADER_REGISTRY.load("opencv")
    target = opencv.VideoTargetMetadata(num_frames=32, fps=-1, max_duration=300)
    data = media_files.mp4_bytes(6, 854, 480, seed=11)
    ours = count_check._overlapped(opencv, loader_cls, data, target, {}, False)
    assert ours is not None
    theirs = opencv.decode_opencv.__wrapped__(loader_cls, data, target, {}, frame_recovery=False)
    frames, source, frame_idx, valid = ours
    assert np.array_equal(frames, theirs[0])
    assert (source, frame_idx, valid) == tuple(theirs[1:])


def test_bad_input_fails_with_vllms_error(installed, monkeypatch):
    not_a_video = b"\x00\x00\x00\x18ftypmp42 this is not a video"
    big = media_files.mp4_bytes(2, 640, 480, seed=1)
    for data, limit in ((not_a_video, None), (big, "1000")):
        if limit:  # an oversized frame: vLLM's pixel limit, checked before anything is decoded
            monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", limit)
        errors = []
        for fast in (False, True):
            media.set_fast_path(fast)
            with pytest.raises(Exception) as info:
                load(data, num_frames=32)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]


def test_concurrent_videos_in_threads(installed):
    """vLLM decodes a server's videos on a pool of 8 threads; each with its check thread."""
    clips = [media_files.mp4_bytes(6, 320, 240, seed=s) for s in range(4)]
    media.set_fast_path(False)
    expected = [load(c, num_frames=32)[0] for c in clips]
    media.set_fast_path(True)
    mismatches: list[int] = []

    def work(i: int) -> None:
        for _ in range(10):
            if not np.array_equal(load(clips[i], num_frames=32)[0], expected[i]):
                mismatches.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []


def test_the_check_is_vllms_on_its_own_capture(installed):
    data = media_files.mp4_bytes(7, 160, 120, seed=3)
    mixin = opencv.OpenCVVideoBackendMixin
    checked = count_check.checked_source(mixin, data)
    header = count_check.header_source(opencv, mixin.open_video_capture(data))
    assert checked == header and checked.total_frames_num == 7


def test_unrecognised_decode_left_alone(monkeypatch):
    def decode_opencv(loader_cls, data, target, sampling_kwargs, *, frame_recovery=False):
        return "upstream changed"

    monkeypatch.setattr(opencv, "decode_opencv", decode_opencv)
    assert count_check.install(lambda: True) is False
    assert opencv.decode_opencv is decode_opencv


def test_both_layouts_of_vllms_decode_are_recognised_and_nothing_else():
    """0.32 hands the check the decode's capture, 0.33-0.34 the bytes (a capture of its own);
    line breaks do not matter, a missing step or a check without the seek does."""
    decode = inspect.getsource(getattr(opencv.decode_opencv, "__wrapped__", opencv.decode_opencv))
    check = inspect.getsource(opencv.OpenCVVideoBackendMixin.get_video_metadata)
    mine = count_check.recognised(decode, check)
    assert mine in count_check.LAYOUTS
    other = "data" if mine == "cap" else "cap"
    theirs = decode.replace(f"get_video_metadata({mine})", f"get_video_metadata(\n    {other}\n)")
    assert count_check.recognised(theirs, check) == other
    assert count_check.recognised(decode.replace("read_frames(", "read_all("), check) is None
    assert count_check.recognised(decode, check.replace("CAP_PROP_POS_AVI_RATIO", "X")) is None


# ---- the check skipped where the container and the decode vouch for the header (mp4_plain) ----


def _box(data: bytes, kind: bytes) -> int:
    """Payload offset of the first box of this type (the fixtures have one of each)."""
    at = data.find(kind)
    assert at > 0, kind
    return at + 4


def hide_lead_in(data: bytes, frames: int) -> bytes:
    """An edit list that starts `frames` frames into the track (what `ffmpeg -ss .. -c copy`
    writes): FFmpeg presents fewer frames than the sample table lists."""
    out = bytearray(data)
    elst, stts, mdhd, mvhd = (_box(data, k) for k in (b"elst", b"stts", b"mdhd", b"mvhd"))
    (delta,) = struct.unpack_from(">I", data, stts + 12)
    (media_scale,) = struct.unpack_from(">I", data, mdhd + 12)
    (movie_scale,) = struct.unpack_from(">I", data, mvhd + 12)
    (segment,) = struct.unpack_from(">I", data, elst + 8)
    hidden = frames * delta
    struct.pack_into(">Ii", out, elst + 8, segment - hidden * movie_scale // media_scale, hidden)
    return bytes(out)


def vfr(frames: int, pts: list[int]) -> bytes:
    """An mp4v clip whose frames have uneven durations (several stts entries)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=30)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.codec_context.time_base = fractions.Fraction(1, 30)
        for i in range(frames):
            rgb = av.VideoFrame.from_ndarray(noise(120, 160, i), format="rgb24")
            frame = rgb.reformat(format="yuv420p")
            frame.pts = pts[i]
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return buf.getvalue()


def outcomes() -> dict[str, float]:
    from prometheus_client import REGISTRY

    name = "gemma4_media_frame_count_check_total"
    return {
        o: REGISTRY.get_sample_value(name, {"outcome": o}) or 0.0
        for o in stages.COUNT_CHECK_OUTCOMES
    }


def fast_outcome(data: bytes, **kwargs) -> tuple[str, tuple, tuple]:
    """vLLM's loader with and without the fast path; which check outcome the fast one had."""
    media.set_fast_path(True)
    load(data, **kwargs)  # the counters exist from here on
    before = outcomes()
    (stock, stock_meta), (fast, fast_meta) = both(data, **kwargs)
    after = outcomes()
    (outcome,) = [o for o in after if after[o] > before[o]]
    return outcome, (stock, stock_meta), (fast, fast_meta)


def corpus() -> dict[str, bytes]:
    clips = {
        f"mp4v {n} frames {w}x{h}": media_files.mp4_bytes(n, w, h, seed=n)
        for n, w, h in ((1, 64, 48), (2, 160, 120), (6, 854, 480), (9, 97, 55), (32, 320, 240))
    }
    clips["vp9 in mp4"] = media_files.mp4_bytes(8, 160, 120, seed=2, fourcc="VP90")
    h264 = io.BytesIO()  # libx264's default preset: B-frames, so a ctts and a delaying edit
    write_h264(h264, [noise(240, 320, i) for i in range(12)], fps=2)
    clips["h264 with B-frames"] = h264.getvalue()
    for hidden in (1, 2, 3):
        clips[f"edit list hiding {hidden}"] = hide_lead_in(clips["mp4v 9 frames 97x55"], hidden)
    clips["variable frame rate"] = vfr(8, [0, 1, 2, 5, 6, 7, 15, 16])
    # the edit list blanked out (a `free` box of the same size): FFmpeg sees no edits
    clips["mp4v without edit list"] = clips["mp4v 9 frames 97x55"].replace(b"edts", b"free", 1)
    clips["h264 without edit list"] = clips["h264 with B-frames"].replace(b"edts", b"free", 1)
    return clips


def test_the_container_vouches_only_where_vllms_check_keeps_the_header():
    """On every clip where mp4_plain vouches for the count, vLLM's own check keeps it; the
    clips it corrects (hidden lead-ins) and the variable-rate one are not vouched for."""
    mixin = opencv.OpenCVVideoBackendMixin
    vouched = set()
    for name, data in corpus().items():
        header = count_check.header_source(opencv, mixin.open_video_capture(data))
        if mp4_plain.frame_count(data) == header.total_frames_num:
            vouched.add(name)
            assert count_check.checked_source(mixin, data) == header, name
    not_vouched = ("edit list", "variable", "h264 without")  # B-frame delay without an edit
    assert vouched == {n for n in corpus() if not n.startswith(not_vouched)}


def test_edit_lists_that_hide_frames_are_corrected_as_vllm_does(installed):
    for hidden, presented in ((2, 7), (3, 6)):
        data = hide_lead_in(media_files.mp4_bytes(9, 97, 55, seed=9), hidden)
        outcome, (stock, stock_meta), (fast, fast_meta) = fast_outcome(data, num_frames=32)
        assert outcome == "corrected"
        assert stock.shape[0] == presented and np.array_equal(stock, fast)
        assert stock_meta == fast_meta


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("mp4v 6 frames 854x480", {"num_frames": 32}, "skipped"),  # the SLO's clip
        ("mp4v 32 frames 320x240", {"num_frames": 8}, "skipped"),  # sampled, last frame included
        ("mp4v 9 frames 97x55", {"num_frames": 6, "frame_recovery": True}, "beside"),
        ("h264 with B-frames", {"num_frames": 32}, "skipped"),
        ("vp9 in mp4", {"num_frames": 32}, "skipped"),
        ("variable frame rate", {"num_frames": 32}, "beside"),
        ("mp4v without edit list", {"num_frames": 32}, "skipped"),
        ("h264 without edit list", {"num_frames": 32}, "beside"),
    ],
)
def test_each_clip_decodes_as_vllm_with_or_without_the_check(installed, name, kwargs, expected):
    outcome, (stock, stock_meta), (fast, fast_meta) = fast_outcome(corpus()[name], **kwargs)
    assert outcome == expected
    assert np.array_equal(stock, fast)
    assert stock_meta == fast_meta


def test_a_decode_that_stops_short_of_the_end_runs_the_check(installed):
    """vLLM's default sampling always takes the last frame; a loader that samples only the
    start (as some models' loaders do) never decodes to the end, so the check runs beside."""
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    class FirstHalf(type(VIDEO_LOADER_REGISTRY.load("opencv"))):
        @classmethod
        def compute_frames_index_to_sample(cls, source, target, **kwargs):
            return list(range(source.total_frames_num // 2))

    target = opencv.VideoTargetMetadata(num_frames=32, fps=-1, max_duration=300)
    data = corpus()["mp4v 32 frames 320x240"]
    count_check._overlapped(opencv, FirstHalf, data, target, {}, False)  # counters exist
    before = outcomes()
    frames, source, frame_idx, valid = count_check._overlapped(
        opencv, FirstHalf, data, target, {}, False
    )
    after = outcomes()
    assert after["beside"] == before["beside"] + 1 and after["skipped"] == before["skipped"]
    theirs = opencv.decode_opencv.__wrapped__(FirstHalf, data, target, {}, frame_recovery=False)
    assert np.array_equal(frames, theirs[0]) and frames.shape[0] == 16
    assert (source, frame_idx, valid) == tuple(theirs[1:])


def test_damaged_frames_fall_back_to_the_check(installed):
    """A plain container whose frame data is damaged: whatever the decoder makes of it, the
    result is vLLM's."""
    data = bytearray(media_files.mp4_bytes(12, 160, 120, seed=5))
    mdat = _box(data, b"mdat")
    for at in range(mdat + 2000, mdat + 9000, 97):
        data[at] ^= 0xFF
    media.set_fast_path(True)
    (stock, stock_meta), (fast, fast_meta) = both(bytes(data), num_frames=32)
    assert np.array_equal(stock, fast) and stock_meta == fast_meta


def test_truncated_or_fragmented_containers_are_not_vouched_for():
    data = media_files.mp4_bytes(6, 160, 120, seed=1)
    assert mp4_plain.frame_count(data) == 6
    stco = _box(data, b"stco")
    beyond = bytearray(data)
    struct.pack_into(">I", beyond, stco + 8, len(data))  # first chunk starts past the end
    assert mp4_plain.frame_count(bytes(beyond)) is None
    moov = _box(data, b"moov")
    assert mp4_plain.frame_count(data[: moov + 100]) is None  # cut inside the index
    assert mp4_plain.frame_count(b"\x00\x00\x00\x18ftypmp42 not a video") is None
    assert mp4_plain.frame_count(data.replace(b"mvhd", b"mvex", 1)) is None


def test_mangled_containers_never_raise_or_blow_up():
    """Client bytes reach mp4_plain before any decoder: byte flips, huge counts and cuts
    anywhere in the index give an answer or None, never an exception or a huge allocation."""
    rng = np.random.default_rng(0)
    data = media_files.mp4_bytes(6, 160, 120, seed=4)
    moov = data.find(b"moov") - 4
    for _ in range(400):
        mangled = bytearray(data)
        for at in rng.integers(moov, len(data), size=int(rng.integers(1, 8))):
            mangled[at] = int(rng.integers(0, 256))
        assert mp4_plain.frame_count(bytes(mangled)) in (None, 6)
    stsz = _box(data, b"stsz")
    huge = bytearray(data)
    struct.pack_into(">II", huge, stsz + 4, 1, 0xFFFFFFFF)  # fixed size 1, 4 billion samples
    assert mp4_plain.frame_count(bytes(huge)) is None
    for cut in range(moov, len(data), 7):
        assert mp4_plain.frame_count(data[:cut]) is None


@pytest.mark.parametrize("codec", ["mp4v", "VP90", "h264"])
def test_one_frame_clip_decodes_as_vllm(installed, codec):
    """A one-frame mp4: vLLM's check seeks the capture to the end and back, after which OpenCV
    reads no frame (stock gives 0 frames); the fast path must give exactly that, not 1 frame."""
    if codec == "h264":
        buf = io.BytesIO()
        write_h264(buf, [noise(48, 64, 0)], fps=2)
        data = buf.getvalue()
    else:
        data = media_files.mp4_bytes(1, 64, 48, seed=1, fourcc=codec)
    media.set_fast_path(True)
    load(data, num_frames=32)  # the counters exist from here on
    before = outcomes()
    (stock, stock_meta), (fast, fast_meta) = both(data, num_frames=32)
    assert outcomes() == before  # vLLM's own decode answered: nothing skipped or moved
    assert fast.shape == stock.shape and np.array_equal(stock, fast)
    assert stock_meta == fast_meta
