"""The input side, as vLLM's multimodal package is: what turns chat messages with images and videos into prompt
tokens. images.py (load, upright, RGB, content hash) and video.py (sources, frames) under image_limits.py's checks
from headers; processor.py (the family's transformers processor), image_layout.py (where each image's tokens are),
video_patches.py and video_prompt.py (video as transformers' Qwen-VL video processors do), prompt.py (all of it
put together: build_prompt)."""
