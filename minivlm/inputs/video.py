"""Videos in, sampled frames out: a list of frames with its fps, an animated GIF / PNG / WebP, or an MP4 / WebM file
(decoded with PyAV). Every limit is checked from the header (size, frame count, duration) before a frame is decoded,
and only the frames the checkpoint's sampler picks are kept; a refusal names the limit, as image_limits' do."""
import hashlib
import io
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageSequence

from minivlm.inputs import image_limits
from minivlm.inputs.images import to_rgb  # frames as images are: transparency on white, 16-bit scaled
from minivlm.inputs.image_limits import encoded_size, mp
from minivlm.refusals import Name, Refused

MAX_VIDEO_BYTES = 64 * 2**20          # one encoded video (an upload, a data: URL)
MAX_VIDEO_SECONDS = 600.0             # the duration a header may announce
MAX_SOURCE_FRAMES = 36_000            # frames a header may announce (10 minutes at 60 fps)
MAX_KEPT_PIXELS = image_limits.MAX_REQUEST_PIXELS  # sampled frames kept in memory, all together (one request)
MAX_ANIMATION_PIXELS = 4 * MAX_KEPT_PIXELS  # an animated image's frames all together (reading its durations decodes)
VIDEO_FORMATS = "MP4, WebM, GIF, animated PNG or WebP"
DEFAULT_GIF_FPS = 10.0                # a GIF whose frames carry no duration
# the refusals a person meets, in English with their {fields} (a page says them again from the fields: error.<reason>)
TOO_MANY_FRAMES = "{name} has {frames} frames, over the {limit} limit per video; cut it shorter"
TOO_LONG = "{name} is {seconds} s long, over the {limit} s limit per video; cut it shorter"
NOT_A_VIDEO = "{name} is not a readable video: not a {formats} file, or damaged ({detail})"
DECODED_FRAMES = "{name}: {frames} sampled frames of {size} are {pixels}, over the {limit} limit of decoded frames " \
                 "per request; ask for a lower fps or fewer frames, or send a smaller video"


@dataclass
class Source:
    """A video before its frames are decoded: what its header says, and how to read frame i."""
    name: str
    width: int
    height: int
    total_frames: int
    fps: float
    content_hash: str                 # the media's identity (file bytes, or the given frames' pixels)
    read: object                      # read(indices) -> uint8 array [len(indices), H, W, 3]

    @property
    def seconds(self) -> float:
        return self.total_frames / self.fps


def video_name(obj, index: int) -> Name:
    return Name("video", index + 1, os.path.basename(str(obj)) if isinstance(obj, (str, os.PathLike)) else None)


def invalid(template: str, reason: str, **fields) -> Refused:
    return Refused("invalid_video", template, reason=reason, **fields)


def _positive(value, what: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise invalid("{name}: {what} must be a positive number, got {value}", "video_value", name=name, what=what,
                      value=repr(value))
    return float(value)


def _check_header(name: str, width: int, height: int, frames: int, fps: float):
    image_limits.check_size(width, height, name=name)
    if frames < 1:
        raise invalid("{name} has no frames", "no_frames", name=name)
    if frames > MAX_SOURCE_FRAMES:
        raise Refused("video_too_large", TOO_MANY_FRAMES, reason="video_frames", name=name, frames=frames,
                      limit=MAX_SOURCE_FRAMES)
    if frames / fps > MAX_VIDEO_SECONDS:
        raise Refused("video_too_large", TOO_LONG, reason="video_seconds", name=name, seconds=f"{frames / fps:.0f}",
                      limit=f"{MAX_VIDEO_SECONDS:.0f}")


def _rgb(frame: Image.Image) -> np.ndarray:
    return np.asarray(frame if frame.mode == "RGB" else to_rgb(frame))


def frames_source(frames: list, fps, name: str) -> Source:
    """Frames given as PIL images (all the same size) at `fps` frames per second."""
    if not frames:
        raise invalid("{name} is an empty list of frames", "no_frames_given", name=name)
    if not all(isinstance(f, Image.Image) for f in frames):
        raise invalid("{name}: a list of frames must hold PIL images only", "frame_type", name=name)
    fps = _positive(fps, "fps (the frames' rate)", name)
    w, h = frames[0].size
    if any(f.size != (w, h) for f in frames):
        raise invalid("{name}: all frames must have one size, got {sizes}", "frame_sizes", name=name,
                      sizes=str(sorted({f.size for f in frames})[:3]))
    _check_header(name, w, h, len(frames), fps)
    digest = hashlib.sha256(repr(("frames", len(frames), w, h)).encode())
    arrays = [_rgb(f) for f in frames]
    for a in arrays:
        digest.update(a.tobytes())
    return Source(name, w, h, len(frames), fps, digest.hexdigest(), lambda idx: np.stack([arrays[i] for i in idx]))


def _file_bytes(obj, name: str) -> bytes:
    encoded_size(obj, name, "video", MAX_VIDEO_BYTES, "send a shorter or smaller file")
    if isinstance(obj, (str, os.PathLike)):
        with open(obj, "rb") as f:
            return f.read()
    return bytes(obj)


def animated_source(img: Image.Image, data: bytes, name: str) -> Source:
    """A GIF / APNG / animated WebP: fps from the frames' durations (10 fps when they carry none)."""
    w, h = img.size
    n = getattr(img, "n_frames", 1)  # counted from the frame headers, nothing decoded
    image_limits.check_size(w, h, name=name)
    if n * w * h > MAX_ANIMATION_PIXELS:
        raise Refused("video_too_large", "{name} is an animation of {frames} frames of {size} = {pixels}, over the "
                      "{limit} limit per animated image; send it as an MP4 or WebM", reason="animation_pixels",
                      name=name, frames=n, size=f"{w}x{h}", pixels=mp(n * w * h), limit=mp(MAX_ANIMATION_PIXELS))
    durations = []
    for frame in ImageSequence.Iterator(img):  # durations live in each frame's header
        durations.append(frame.info.get("duration", 0) or 0)
        if len(durations) >= n:
            break
    total_ms = sum(durations)
    fps = n / (total_ms / 1000) if total_ms > 0 else DEFAULT_GIF_FPS
    _check_header(name, w, h, n, fps)

    def read(indices):
        out = []
        for i in indices:
            img.seek(int(i))
            out.append(_rgb(img.convert("RGBA") if img.mode == "P" else img))
        return np.stack(out)
    return Source(name, w, h, n, fps, hashlib.sha256(data).hexdigest(), read)


def av_source(data: bytes, name: str) -> Source:
    """An MP4 / WebM / other container PyAV reads: the first video stream, its frame count and rate."""
    import av
    try:
        container = av.open(io.BytesIO(data))
        stream = container.streams.video[0]
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise invalid(NOT_A_VIDEO, "not_a_video", name=name, formats=VIDEO_FORMATS, detail=type(e).__name__) from None
    rate = stream.average_rate or stream.guessed_rate
    fps = float(rate) if rate else 0.0
    if fps <= 0:
        raise invalid("{name} has no frame rate in its header", "no_frame_rate", name=name)
    w, h = stream.codec_context.width, stream.codec_context.height
    frames = stream.frames
    if not frames and stream.duration and stream.time_base:  # WebM: no count; estimate from duration, then count
        frames = int(float(stream.duration * stream.time_base) * fps + 0.5)
    _check_header(name, w, h, max(frames, 1), fps)
    if not stream.frames:  # count packets without decoding (each video packet is one frame)
        frames = sum(1 for p in container.demux(stream) if p.size)
        container.seek(0)
        _check_header(name, w, h, frames, fps)

    def read(indices):
        wanted, out = set(int(i) for i in indices), {}
        container.seek(0)
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")
            if i >= max(wanted):
                break
        if len(out) < len(wanted):
            raise invalid("{name} ended after {read} frames; its header announced {frames}", "video_cut_short",
                          name=name, read=i + 1, frames=frames)
        return np.stack([out[int(i)] for i in indices])
    return Source(name, w, h, frames, fps, hashlib.sha256(data).hexdigest(), read)


def open_video(obj, fps, name: str) -> Source:
    """A video's source, every header limit checked, nothing decoded yet. `fps` is the frames' rate for a list of
    frames (a file's own rate is in its header)."""
    if isinstance(obj, (list, tuple)):
        return frames_source(list(obj), fps, name)
    if not isinstance(obj, (bytes, bytearray, str, os.PathLike)):
        raise invalid("a video must be a list of PIL frames, encoded bytes or a file path, got {type}", "video_type",
                      type=type(obj).__name__)
    data = _file_bytes(obj, name)
    try:
        img = Image.open(io.BytesIO(data))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        img = None  # not an image: a container for PyAV
    if img is not None and img.format in ("GIF", "PNG", "WEBP"):
        return animated_source(img, data, name)
    return av_source(data, name)


def decode_frames(source: Source, indices: list[int]) -> np.ndarray:
    """The sampled frames, uint8 [T, H, W, 3], decoded within the request's and the server's pixel budgets."""
    pixels = len(indices) * source.width * source.height
    if pixels > MAX_KEPT_PIXELS:
        raise Refused("video_too_large", DECODED_FRAMES, reason="decoded_frames", name=source.name,
                      frames=len(indices), size=f"{source.width}x{source.height}", pixels=mp(pixels),
                      limit=mp(MAX_KEPT_PIXELS))
    image_limits.SERVER.acquire(pixels, source.name)
    try:
        frames = source.read(indices)
    finally:
        image_limits.SERVER.release(pixels)
    if frames.shape[1:3] != (source.height, source.width):
        raise invalid("{name}: frames are {size}, its header said {header}", "frame_size_mismatch", name=source.name,
                      size=f"{frames.shape[2]}x{frames.shape[1]}", header=f"{source.width}x{source.height}")
    return frames
