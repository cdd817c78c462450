"""Gemma 4's image rule: every image is resized, aspect kept, to the largest size whose 16-px patches fit the
soft-token budget (max_soft_tokens · pool² patches) with both sides multiples of pool · patch; then each pool x pool
block of patches becomes one soft token. The tower (or the 12B's patch embedder) sees the budget's patch count
whatever the image: the processor pads every image to it."""
import math

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)  # what transformers' Gemma 4 image processors accept
DEFAULT_SOFT_TOKENS = 280
SOFT_TOKEN_FAMILIES = ("gemma4", "gemma4_unified")  # the model types whose images this rule sizes
GEMMA4_MARKERS = 2  # <start_of_image> and <end_of_image> around each image's soft tokens (Gemma4Processor)


def soft_token_size(height: int, width: int, patch: int, pool: int, max_soft_tokens: int) -> tuple[int, int]:
    """The size (height, width) the processor resizes an image to: the ideal scale floored to the pool · patch grid;
    a side that floors to 0 becomes one grid step and the other its aspect multiple, capped at the budget's side."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max_soft_tokens not in SOFT_TOKEN_BUDGETS:
        raise ValueError(f"max_soft_tokens must be one of {SOFT_TOKEN_BUDGETS}, got {max_soft_tokens}")
    max_patches, step = max_soft_tokens * pool ** 2, pool * patch
    factor = math.sqrt(max_patches * patch ** 2 / (height * width))
    h, w = math.floor(factor * height / step) * step, math.floor(factor * width / step) * step
    longest = (max_patches // pool ** 2) * step
    if h == 0 and w == 0:
        raise ValueError(f"a {height}x{width} image resizes to 0x0 under Gemma 4's {max_soft_tokens}-token budget")
    if h == 0:
        h, w = step, min(width // height * step, longest)
    elif w == 0:
        h, w = min(height // width * step, longest), step
    return h, w


def soft_tokens(height: int, width: int, patch: int, pool: int, max_soft_tokens: int) -> int:
    """Soft tokens (image placeholder tokens) of one image: its resized patches / pool²."""
    h, w = soft_token_size(height, width, patch, pool, max_soft_tokens)
    return (h // patch) * (w // patch) // pool ** 2
