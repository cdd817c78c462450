"""A sampled video becomes patches and placeholder text the way transformers' Qwen2-VL / Qwen3-VL video processors
make them (video_processing_qwen2_vl.py, video_processing_qwen3_vl.py), in plain torch (no torchvision): which
frames are sampled, the resize (bicubic, antialiased, on uint8 frames), normalisation, the temporal-pair patches,
and the text that stands for it (Qwen3-VL writes a timestamp before each frame pair)."""
import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from minivlm.inputs.video import Source, decode_frames
from minivlm.refusals import Refused


@dataclass(frozen=True)
class VideoSettings:
    """The checkpoint's video processor, read as transformers reads it (video_settings below)."""
    style: str                        # "qwen2" (Qwen2-VL, Qwen2.5-VL) or "qwen3" (pixel budget per video, timestamps)
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int                   # size.shortest_edge: per frame (qwen2) or per video (qwen3)
    max_pixels: int                   # size.longest_edge: likewise
    min_frames: int
    max_frames: int
    fps: float                        # sampling rate when a request names none
    image_mean: tuple
    image_std: tuple
    rescale_factor: float
    tokens_per_second: float          # Qwen2.5-VL: M-RoPE time units per second (0: t counts temporal patches)
    timestamps: bool                  # Qwen3-VL: "<t seconds>" text before each frame pair

    def key(self) -> tuple:
        return (self.style, self.patch_size, self.temporal_patch_size, self.merge_size, self.min_pixels,
                self.max_pixels, self.min_frames, self.max_frames, self.image_mean, self.image_std)


DEFAULTS = {  # transformers' Qwen2VLVideoProcessor / Qwen3VLVideoProcessor class attributes
    "qwen2": dict(patch_size=14, merge_size=2, min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768,
                  image_mean=(0.48145466, 0.4578275, 0.40821073), image_std=(0.26862954, 0.26130258, 0.27577711)),
    "qwen3": dict(patch_size=16, merge_size=2, min_pixels=128 * 32 * 32, max_pixels=32 * 32 * 768,
                  image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5)),
}


# Where transformers 5.23 finds a video processor's settings, first found wins (BaseVideoProcessor.
# get_video_processor_dict): the "video_processor" dict nested in processor_config.json (what ProcessorMixin.
# save_pretrained writes from v5), else video_preprocessor_config.json, else preprocessor_config.json (the image
# processor's: published Qwen2-VL / Qwen2.5-VL checkpoints ship only that one, and it sets their video size too).
SAVED_VIDEO_PROCESSOR = ("processor_config.json", "video_preprocessor_config.json", "preprocessor_config.json")


def saved_video_processor(model_dir: str) -> tuple[dict, str | None]:
    """(the video processor's saved fields, the file they came from), in transformers' order; ({}, None) when the
    checkpoint has none of the three (transformers then cannot load a video processor; the engine takes the class
    defaults)."""
    nested = os.path.join(model_dir, SAVED_VIDEO_PROCESSOR[0])
    if os.path.isfile(nested):
        with open(nested) as f:
            found = json.load(f).get("video_processor")
        if found is not None:
            return found, SAVED_VIDEO_PROCESSOR[0]
    for name in SAVED_VIDEO_PROCESSOR[1:]:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                return json.load(f), name
    return {}, None


def pixel_range(saved: dict, style: str) -> tuple[int, int]:
    """(shortest_edge, longest_edge) as the class's __init__ resolves them: the saved `size` (else the class's);
    Qwen2VLVideoProcessor then lets top-level `min_pixels` / `max_pixels` override it (published Qwen2/2.5-VL write
    only those), Qwen3VLVideoProcessor ignores them. A `size` of {min_pixels, max_pixels} without the top-level keys
    (written by transformers 4.49) is read as that range, where transformers 5.23 refuses its videos."""
    d = DEFAULTS[style]
    size = {k: v for k, v in (saved.get("size") or {}).items() if v is not None}
    lo = size.get("shortest_edge", size.get("min_pixels", d["min_pixels"]))
    hi = size.get("longest_edge", size.get("max_pixels", d["max_pixels"]))
    if style == "qwen2":
        lo = saved["min_pixels"] if saved.get("min_pixels") is not None else lo
        hi = saved["max_pixels"] if saved.get("max_pixels") is not None else hi
    return lo, hi


def video_settings(model_dir: str, model_type: str) -> VideoSettings | None:
    """The video processor of a Qwen-VL checkpoint dir as transformers reads it (None for other families: they take
    no video): its saved fields (saved_video_processor), a field saved as null or missing taking the class default
    (DEFAULTS; transformers' _set_attributes does the same), and the pixel range from pixel_range."""
    if model_type not in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        return None
    style = "qwen3" if model_type in ("qwen3_vl", "qwen3_5") else "qwen2"  # Qwen3.5 ships Qwen3-VL's video processor
    saved, _ = saved_video_processor(model_dir)
    d = DEFAULTS[style]

    def field(name, default):
        return saved[name] if saved.get(name) is not None else default

    min_pixels, max_pixels = pixel_range(saved, style)
    tps = 0.0
    with open(os.path.join(model_dir, "config.json")) as f:
        vision = json.load(f).get("vision_config", {})
    if model_type == "qwen2_5_vl":
        tps = float(vision.get("tokens_per_second", 4))
    return VideoSettings(
        style=style, patch_size=field("patch_size", d["patch_size"]),
        temporal_patch_size=field("temporal_patch_size", 2), merge_size=field("merge_size", d["merge_size"]),
        min_pixels=min_pixels, max_pixels=max_pixels, min_frames=field("min_frames", 4),
        max_frames=field("max_frames", 768), fps=float(field("fps", 2.0)),
        image_mean=tuple(field("image_mean", d["image_mean"])), image_std=tuple(field("image_std", d["image_std"])),
        rescale_factor=field("rescale_factor", 1 / 255), tokens_per_second=tps, timestamps=style == "qwen3")


@dataclass
class VideoFacts:
    """What shaped one video's tokens and KV: it all enters key C (the frames' own content is in content_hash)."""
    source_fps: float                 # the frames' rate (a file's header, or the request's for a list of frames)
    total_frames: int
    indices: list[int]                # which source frames were sampled
    sample_fps: float | None          # the rate asked for (None: the frames were given as they are)
    frames_hash: str                  # the sampled frames' pixels
    resized: tuple[int, int]          # (height, width) every frame was resized to
    second_per_grid: float            # seconds one temporal patch spans (Qwen2.5-VL's second_per_grid_ts)
    t_scale: float                    # M-RoPE t units per temporal patch (Qwen2.5-VL), 1 otherwise
    timestamps: list[float] = field(default_factory=list)  # Qwen3-VL: seconds of each frame pair
    frame_runs: bool = False          # Qwen3-VL: each frame pair is its own run of placeholders (timestamps between)
    source_size: tuple[int, int] = (0, 0)  # (w, h) of the source frames

    def key(self) -> tuple:
        return ("video", self.frames_hash, tuple(self.indices), self.total_frames, self.source_fps, self.sample_fps,
                self.resized, self.second_per_grid, self.t_scale)


def sample_indices(s: VideoSettings, total: int, source_fps: float, fps: float | None,
                   num_frames: int | None) -> list[int]:
    """Which frames the checkpoint's sampler takes (transformers' sample_frames of each style)."""
    if fps is not None and num_frames is not None:
        raise Refused("invalid_video", "give a video's fps or its num_frames, not both", reason="fps_and_num_frames")
    if s.style == "qwen3":
        if num_frames is None:
            num_frames = int(total / source_fps * (fps if fps is not None else s.fps))
            num_frames = min(max(num_frames, s.min_frames), s.max_frames, total)
        return np.linspace(0, total - 1, num_frames).round().astype(int).tolist()
    t = s.temporal_patch_size
    if num_frames is not None:
        num_frames = round(num_frames / t) * t
    else:
        top = math.floor(min(s.max_frames, total) / t) * t
        num_frames = total / source_fps * (fps if fps is not None else s.fps)
        num_frames = math.floor(min(max(num_frames, s.min_frames), top, total) / t) * t
    if num_frames < 1 or num_frames > total:
        raise Refused("invalid_video", "cannot sample {frames} frames from a video of {total} frames (the processor "
                      "takes multiples of {multiple}, at least {least}); ask for another fps or num_frames",
                      reason="cannot_sample", frames=num_frames, total=total, multiple=t, least=s.min_frames)
    return torch.arange(0, total, total / num_frames).int().tolist()


def smart_resize(s: VideoSettings, frames: int, height: int, width: int) -> tuple[int, int]:
    """The frame size both styles resize to: multiples of patch x merge, within the pixel budget."""
    factor = s.patch_size * s.merge_size
    per_video = s.style == "qwen3"
    if per_video:
        if frames < s.temporal_patch_size:
            raise Refused("invalid_video", "a video needs at least {least} frames, got {frames}", reason="few_frames",
                          least=s.temporal_patch_size, frames=frames)
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise Refused("invalid_video", "a video's aspect ratio must be under 200, got {ratio}", reason="aspect_ratio",
                      ratio=f"{max(height, width) / min(height, width):.0f}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / s.temporal_patch_size) * s.temporal_patch_size if per_video else 1
    n = frames if per_video else 1
    if t * h_bar * w_bar > s.max_pixels:
        beta = math.sqrt(n * height * width / s.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h_bar * w_bar < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (n * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(s: VideoSettings, frames: np.ndarray) -> tuple[torch.Tensor, tuple[int, int, int], tuple[int, int]]:
    """uint8 frames [T, H, W, 3] -> patches [t*h*w, 3*temporal*patch*patch], grid (t, h, w), resized (H', W')."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # [T, 3, H, W]
    rh, rw = smart_resize(s, video.shape[0], video.shape[2], video.shape[3])
    if (rh, rw) != tuple(video.shape[2:]):  # as torchvision's resize: torch's own uint8 antialiased bicubic kernel
        video = torch.nn.functional.interpolate(video.contiguous(), size=(rh, rw), mode="bicubic", align_corners=False,
                                                antialias=True)
    mean = torch.tensor(s.image_mean) * (1.0 / s.rescale_factor)  # transformers' fused rescale + normalise
    std = torch.tensor(s.image_std) * (1.0 / s.rescale_factor)
    video = (video.to(torch.float32) - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    p, m, tp = s.patch_size, s.merge_size, s.temporal_patch_size
    if pad := -video.shape[0] % tp:  # an odd frame count repeats the last frame
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
    gt, gh, gw = video.shape[0] // tp, rh // p, rw // p
    patches = video.view(gt, tp, 3, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, 3 * tp * p * p), (gt, gh, gw), (rh, rw)


def frame_timestamps(indices: list[int], fps: float, temporal: int) -> list[float]:
    """Qwen3-VL's seconds of each frame pair: the mean of its first and last frame's time."""
    idx = list(indices)
    if len(idx) % temporal:
        idx += [idx[-1]] * (temporal - len(idx) % temporal)
    times = [i / fps for i in idx]
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


def process_video(s: VideoSettings, source: Source, indices: list[int], aimed: float | None):
    """The sampled frames of a source -> (patches, grid, VideoFacts). `aimed`: the rate the sampler aimed at (None
    when a list of frames was used as given, or num_frames chose the count)."""
    frames = decode_frames(source, indices)
    patches, grid, resized = patchify(s, frames)
    sampled_fps = len(indices) / source.total_frames * source.fps
    spg = s.temporal_patch_size / sampled_fps
    t_scale = float(s.tokens_per_second * torch.tensor(spg, dtype=torch.float32)) if s.tokens_per_second else 1.0
    stamps = frame_timestamps(indices, source.fps, s.temporal_patch_size) if s.timestamps else []
    facts = VideoFacts(source.fps, source.total_frames, indices, aimed, hashlib.sha256(frames.tobytes()).hexdigest(),
                       resized, spg, t_scale, stamps, s.timestamps, (source.width, source.height))
    return patches, grid, facts


def placeholder_text(s: VideoSettings, grid: tuple[int, int, int], facts: VideoFacts, video_token: str,
                     start: str, end: str) -> str:
    """What replaces the template's video token (as the processors' replace_video_token write it)."""
    t, h, w = grid
    per_frame = h * w // s.merge_size ** 2
    if not s.timestamps:
        return video_token * (t * per_frame)
    return "".join(f"<{facts.timestamps[i]:.1f} seconds>{start}{video_token * per_frame}{end}" for i in range(t))
