"""Videos in a chat: pulled out of the messages, every header checked and every sample planned before a frame is
decoded, patched, and written into the rendered prompt as the checkpoint's processor would (transformers'
replace_video_token), then found again in the token ids (one run per video, or per frame pair with timestamps)."""
from dataclasses import dataclass

import torch

from minivlm.inputs.image_layout import runs
from minivlm.inputs.video import MAX_KEPT_PIXELS, Source, open_video, video_name
from minivlm.inputs.video_patches import VideoFacts, VideoSettings, placeholder_text, process_video, sample_indices
from minivlm.inputs.image_limits import mp
from minivlm.refusals import Refused

VIDEO_OPTIONS = ("fps", "num_frames")


@dataclass
class VideoItem:
    """One video of a request: what was asked, its source, and (once processed) its patches."""
    raw: object
    fps: float | None = None          # a list of frames: their rate; a file: the rate to sample at
    num_frames: int | None = None     # a file: how many frames to sample instead of an fps
    source: Source | None = None
    indices: list | None = None
    patches: torch.Tensor | None = None
    grid: tuple | None = None
    facts: VideoFacts | None = None

    @property
    def given(self) -> bool:
        return isinstance(self.raw, (list, tuple))

    def aimed(self, settings: VideoSettings) -> float | None:
        """The sampling rate aimed at: None for frames used as given, or when num_frames chose the count."""
        if self.given or self.num_frames is not None:
            return None
        return self.fps if self.fps is not None else settings.fps


def video_item(item: dict) -> VideoItem:
    """A chat content item {"type": "video", "video": ..., "fps": ..., "num_frames": ...} -> VideoItem."""
    if item.get("video") is None:
        raise Refused("invalid_video", "a video content item has no 'video'", reason="no_video_item")
    fps, num = item.get("fps"), item.get("num_frames")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 120):
        raise Refused("invalid_video", "a video's fps must be a number in (0, 120], got {fps}", reason="video_fps",
                      fps=repr(fps))
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < 1):
        raise Refused("invalid_video", "a video's num_frames must be a positive int, got {num}",
                      reason="video_num_frames", num=repr(num))
    return VideoItem(item["video"], None if fps is None else float(fps), num)


def prepare_videos(settings: VideoSettings | None, items: list[VideoItem], title: str) -> list[VideoItem]:
    """Open every video (headers only), plan its samples and check the request's total, then decode and patch."""
    if items and settings is None:
        raise Refused("invalid_video", "{model} takes no video ({n} given); video needs a Qwen2-VL, Qwen2.5-VL or "
                      "Qwen3-VL checkpoint", reason="takes_no_video", model=title, n=len(items))
    planned = 0
    for i, v in enumerate(items):
        name = video_name(v.raw, i)
        if v.given and v.num_frames is not None:
            raise Refused("invalid_video", "{name}: num_frames samples a video file; a list of frames is used as "
                          "given", reason="frames_given", name=name)
        v.source = open_video(v.raw, (v.fps or settings.fps) if v.given else None, name)
        if v.given:
            v.indices = list(range(v.source.total_frames))
            if len(v.indices) > settings.max_frames:
                raise Refused("video_too_large", "{name} has {frames} frames, over this checkpoint's {limit} frames "
                              "per video (max_frames); give fewer frames", reason="max_frames", name=name,
                              frames=len(v.indices), limit=settings.max_frames)
        else:
            v.indices = sample_indices(settings, v.source.total_frames, v.source.fps, v.fps, v.num_frames)
        planned += len(v.indices) * v.source.width * v.source.height
        if planned > MAX_KEPT_PIXELS:
            raise Refused("video_too_large", "the videos of this request sample {pixels} of frames together, over "
                          "the {limit} limit per request; ask for a lower fps or fewer frames", reason="videos_pixels",
                          pixels=mp(planned), limit=mp(MAX_KEPT_PIXELS))
    for v in items:
        v.patches, v.grid, v.facts = process_video(settings, v.source, v.indices, v.aimed(settings))
    return items


def expand_videos(processor, text: str, items: list[VideoItem]) -> str:
    """Replace each video token the chat template wrote with the video's placeholder text, in order."""
    token = processor.video_token or "<|video_pad|>"
    if text.count(token) != len(items):
        why = ": it has no place for a video (an image-only checkpoint)" if not text.count(token) else ""
        raise Refused("invalid_video", "this checkpoint's chat template placed {placed} videos for {n} given{why}",
                      reason="template_videos", placed=text.count(token), n=len(items), why=why)
    s = processor.video_settings
    start = getattr(processor, "vision_start_token", "<|vision_start|>")
    end = getattr(processor, "vision_end_token", "<|vision_end|>")
    parts = text.split(token)
    out = [parts[0]]
    for v, rest in zip(items, parts[1:]):
        out.append(placeholder_text(s, v.grid, v.facts, token, start, end))
        out.append(rest)
    return "".join(out)


def video_spans(types: list[int], items: list[VideoItem]) -> list[tuple[int, int, int]]:
    """(start, end, placeholders) of each video in the prompt: its runs of video tokens (type 2)."""
    found = runs([int(t == 2) for t in types])
    spans, k = [], 0
    for v in items:
        n = v.grid[0] if v.facts.frame_runs else 1
        mine = found[k:k + n]
        k += n
        if len(mine) != n:
            raise Refused("invalid_video", "the processor laid out {runs} video runs, fewer than the videos need",
                          reason="video_layout", runs=len(found))
        spans.append((mine[0][0], mine[-1][1], sum(b - a for a, b in mine)))
    return spans


def vision_runs(images: list) -> tuple[list[tuple[int, int, int]], list[float | None]]:
    """The grid and time scale of each run of placeholders, for M-RoPE: an image is one run; a Qwen2-VL / 2.5-VL
    video one run with its t frame pairs; a Qwen3-VL video one run per frame pair (t = 1, as get_rope_index splits
    video_grid_thw), since timestamp text stands between them."""
    grids, scales = [], []
    for im in images:
        facts = getattr(im, "video", None)
        if facts is None:
            grids.append(im.grid_thw)
            scales.append(None)
        elif facts.frame_runs:
            t, h, w = im.grid_thw
            grids += [(1, h, w)] * t
            scales += [None] * t
        else:
            grids.append(im.grid_thw)
            scales.append(facts.t_scale)
    return grids, scales
