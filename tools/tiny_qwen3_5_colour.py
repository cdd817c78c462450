"""Per-vision-token colour labels for the tiny Qwen3.5's tower, read from the processor's own pixels: the final
vision tokens must carry colour (Qwen3.5 has no DeepStack, through which the tiny Qwen3-VL's decoder got it)."""
import torch

from tools.scenes import COLORS

PALETTE = torch.tensor(list(COLORS.values()), dtype=torch.float32) / 255


def colour_labels(pixel_values: torch.Tensor, kinds: torch.Tensor, patch: int, mean: float = 0.5,
                  std: float = 0.5) -> torch.Tensor:
    """The palette index nearest each merged token's centre colour, for tokens in a shape's box (kinds[i] < 3)
    whose centre is within 0.2 (RGB in [0, 1]) of a palette colour (jitter is at most 0.14); else -100.
    pixel_values rows are patches, four consecutive per merged token (2 x 2), each (3 channels, 2 frames, patch,
    patch); the centre is the four patches' pixels that touch it."""
    p = pixel_values.view(-1, 4, 3, 2, patch, patch)[:, :, :, 0] * std + mean  # first frame, back to [0, 1]
    corners = torch.stack([p[:, 0, :, -1, -1], p[:, 1, :, -1, 0], p[:, 2, :, 0, -1], p[:, 3, :, 0, 0]], 1).mean(1)
    distance, labels = torch.cdist(corners, PALETTE).min(-1)
    # in a shape's box but on background (a circle's or triangle's corner), or an anti-aliased edge: no label
    inside = (kinds < 3) & (distance < 0.2)
    return torch.where(inside, labels, torch.full_like(labels, -100))
