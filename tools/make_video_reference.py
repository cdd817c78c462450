"""Store what transformers' OWN Qwen-VL video processors make of the test clips, once, for tests that run without
torchvision (transformers' video processors import it; the project's venv has none).

Run in a separate venv that has torchvision (same transformers version):
    python -m tools.make_video_reference tests/fixtures/video_reference.npz
The processors are built from the test checkpoints' own files (tools/make_checkpoint.py, as tests/conftest.py makes
them: family i with seed i) and transformers' Qwen2VLVideoProcessor / Qwen3VLVideoProcessor read from their
video_preprocessor_config.json. tests/test_video.py checks minivlm's tokens, grids and patches against this file
and feeds its tensors to transformers' model as the teacher-forced truth."""
import json
import os
import sys
import tempfile

import numpy as np
from PIL import Image

from tools.video_clips import gif_bytes, gif_frames, moving_square

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
CLIP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "examples",
                    "moving_square.mp4")


def scene(w, h, color):
    img = Image.new("RGB", (w, h), (230, 230, 230))
    img.paste(color, (w // 4, h // 4, w // 2, h // 2))
    return img


def cases():
    """name -> (messages with the real media, [(video array, metadata)], HF video kwargs). The same recipe builds
    the engine's request in tests/test_video.py. A video given as a path (the MP4) is decoded and sampled by
    transformers' own PyAV reader (load_video) with its processor's sampler; the metadata then says how."""
    clip8 = moving_square(8)
    gif = gif_bytes(moving_square(20, hue=30), 10)
    clip6, clip4 = moving_square(6, 56, 56, hue=90), moving_square(4, hue=160)
    arr = lambda frames: np.stack([np.asarray(f) for f in frames])
    meta = lambda n, fps: {"fps": fps, "total_num_frames": n, "frames_indices": list(range(n))}
    return {
        "frames": ([{"role": "user", "content": [{"type": "video", "video": clip8, "fps": 4},
                                                 {"type": "text", "text": "What happens?"}]}],
                   [(arr(clip8), meta(8, 4.0))], {"do_sample_frames": False}),
        "gif": ([{"role": "user", "content": [{"type": "video", "video": gif, "fps": 2},
                                              {"type": "text", "text": "Describe the image."}]}],
                [(gif_frames(gif), {"fps": 10.0, "total_num_frames": 20})], {"do_sample_frames": True, "fps": 2}),
        "mixed": ([{"role": "user", "content": [{"type": "image", "image": scene(90, 60, (220, 30, 30))},
                                                {"type": "video", "video": clip6, "fps": 3},
                                                {"type": "text", "text": "What shape is it?"}]},
                   {"role": "assistant", "content": "square"},
                   {"role": "user", "content": [{"type": "video", "video": clip4, "fps": 2},
                                                {"type": "text", "text": "What color is the square?"}]}],
                  [(arr(clip6), meta(6, 3.0)), (arr(clip4), meta(4, 2.0))], {"do_sample_frames": False}),
        "mp4": ([{"role": "user", "content": [{"type": "video", "video": CLIP, "fps": 2},
                                              {"type": "text", "text": "What happens in the video?"}]}],
                [(CLIP, {"fps": 2})], {"do_sample_frames": False}),
    }


def decoded(processor, video, metadata):
    """A path decoded by transformers' PyAV reader, sampled by the processor's own sample_frames."""
    if not isinstance(video, str):
        return video, metadata
    from functools import partial
    from transformers.video_utils import load_video
    return load_video(video, backend="pyav", sample_indices_fn=partial(processor.video_processor.sample_frames,
                                                                        **metadata))


def template_messages(messages):
    """The messages as the chat template sees them (media replaced by their type)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": c["type"]} if c["type"] in ("image", "video") else c for c in content]
        out.append({"role": m["role"], "content": content})
    return out


def hf_processor(path: str, family: str):
    from transformers import AutoTokenizer
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil, Qwen2VLProcessor, Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor
    cls = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[family]
    video = (Qwen3VLVideoProcessor if family == "qwen3_vl" else Qwen2VLVideoProcessor).from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return cls(Qwen2VLImageProcessorPil.from_pretrained(path), tokenizer, video, chat_template=tokenizer.chat_template)


def reference(path: str, family: str) -> dict:
    processor = hf_processor(path, family)
    out = {}
    for name, (messages, videos, kwargs) in cases().items():
        videos = [decoded(processor, v, m) for v, m in videos]
        text = processor.apply_chat_template(template_messages(messages), tokenize=False, add_generation_prompt=True)
        images = [c["image"] for m in messages if isinstance(m["content"], list) for c in m["content"]
                  if c["type"] == "image"]
        got = processor(text=[text], images=images or None, videos=[v for v, _ in videos],
                        video_metadata=[m for _, m in videos], return_tensors="pt", **kwargs)
        for key in ("input_ids", "mm_token_type_ids", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts",
                    "pixel_values", "image_grid_thw"):
            if key in got:
                out[f"{family}/{name}/{key}"] = got[key].numpy()
    with open(os.path.join(path, "video_preprocessor_config.json")) as f:
        out[f"{family}/video_preprocessor_config"] = np.array(json.dumps(json.load(f), sort_keys=True))
    return out


def main(dest: str):
    from tools.make_checkpoint import make_random_checkpoint
    import transformers
    import torchvision
    data = {"versions": np.array(f"transformers {transformers.__version__}, torchvision {torchvision.__version__}")}
    with tempfile.TemporaryDirectory() as root:
        for i, family in enumerate(FAMILIES):
            path = make_random_checkpoint(family, os.path.join(root, family), seed=i)
            data.update(reference(path, family))
    np.savez_compressed(dest, **data)
    print(f"wrote {dest}: {len(data)} arrays, {os.path.getsize(dest) / 1e3:.0f} kB")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/video_reference.npz")
