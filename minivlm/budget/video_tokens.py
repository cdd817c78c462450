"""How many LLM tokens a video becomes ("video: N s at F fps"), by the engine's own rule (minivlm.inputs.video_patches:
the checkpoint's sampler, smart_resize per frame or per video, temporal pairs, 2x2 merge; Qwen3-VL's timestamps)."""
import os
from dataclasses import dataclass

from minivlm.budget.shapes import QWEN_VL, hf_config
from minivlm.inputs.video_patches import DEFAULTS, VideoSettings, sample_indices, smart_resize, video_settings

TIMESTAMP_TOKENS = 6       # "<1.5 seconds>" in a Qwen tokenizer: about 6 tokens (an estimate), + start / end


@dataclass(frozen=True)
class VideoPlan:
    """One video in the prompt: sampled frames, frame pairs, tokens per pair, all its tokens (placeholders plus
    markers: vision start / end, and Qwen3-VL's timestamps per pair), ViT patches, and the frame size it is
    resized to."""
    frames: int
    pairs: int
    tokens_per_pair: int
    vision_tokens: int
    marker_tokens: int
    patches: int
    resized: tuple[int, int]

    @property
    def tokens(self) -> int:
        return self.vision_tokens + self.marker_tokens


def settings_for(model_config) -> VideoSettings:
    """A checkpoint dir's video processor, else the family's published defaults (patch / merge from the config)."""
    if isinstance(model_config, str) and os.path.isdir(model_config):
        cfg = hf_config(model_config)
        found = video_settings(model_config, cfg.model_type)
        if found is not None:
            return found
    cfg = hf_config(model_config)
    if cfg.model_type not in QWEN_VL:
        raise ValueError(f"{cfg.model_type} takes no video (video: Qwen2-VL, Qwen2.5-VL, Qwen3-VL)")
    style = "qwen3" if cfg.model_type == "qwen3_vl" else "qwen2"
    d = DEFAULTS[style]
    v = cfg.vision_config
    return VideoSettings(style, getattr(v, "patch_size", d["patch_size"]), getattr(v, "temporal_patch_size", 2),
                         getattr(v, "spatial_merge_size", 2), d["min_pixels"], d["max_pixels"], 4, 768, 2.0,
                         d["image_mean"], d["image_std"], 1 / 255, float(getattr(v, "tokens_per_second", 0) or 0),
                         style == "qwen3")


def video_plan(model_config, seconds: float, fps: float, width: int, height: int,
               source_fps: float = 30.0) -> VideoPlan:
    """What one video of `seconds` at `source_fps`, sampled at `fps`, of width x height frames, costs."""
    if not seconds > 0 or not fps > 0 or width < 1 or height < 1:
        raise ValueError(f"a video needs seconds > 0, fps > 0 and a frame size, got {seconds} s, {fps} fps, "
                         f"{width}x{height}")
    s = settings_for(model_config)
    total = max(1, round(seconds * source_fps))
    frames = len(sample_indices(s, total, source_fps, fps, None))
    h, w = smart_resize(s, frames, height, width)
    pairs = -(-frames // s.temporal_patch_size)
    per_pair = (h // s.patch_size) * (w // s.patch_size) // s.merge_size ** 2
    markers = pairs * (2 + TIMESTAMP_TOKENS) if s.timestamps else 2
    return VideoPlan(frames, pairs, per_pair, pairs * per_pair, markers, pairs * per_pair * s.merge_size ** 2, (h, w))

