"""Short synthetic clips for the video tests and their stored transformers reference (tools/make_video_reference.py):
a square that moves across a coloured background, one colour step per frame, so every frame differs."""
import io

import numpy as np
from PIL import Image


def moving_square(n: int, width: int = 64, height: int = 48, hue: int = 0) -> list[Image.Image]:
    """n RGB frames; frame i has its square i * 5 pixels further right and a slightly different background."""
    frames = []
    for i in range(n):
        a = np.zeros((height, width, 3), np.uint8)
        a[:, :] = ((40 + 13 * i + hue) % 256, (90 + 7 * i) % 256, (200 - 11 * i + hue) % 256)
        x = (5 * i) % (width - 12)
        a[height // 4:height // 4 + 12, x:x + 12] = (250, 240, 30)
        a[-6:, :] = (10, 10, 10)
        frames.append(Image.fromarray(a))
    return frames


def gif_bytes(frames: list[Image.Image], fps: float) -> bytes:
    """An animated GIF of the frames (few colours, so lossless) at fps."""
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0,
                   optimize=False, disposal=1)
    return buf.getvalue()


def gif_frames(data: bytes) -> np.ndarray:
    """The GIF's frames as PIL decodes them, RGB uint8 [T, H, W, 3] (what a video processor is given)."""
    from PIL import ImageSequence
    img = Image.open(io.BytesIO(data))
    return np.stack([np.asarray(f.convert("RGBA").convert("RGB")) for f in ImageSequence.Iterator(img)])
