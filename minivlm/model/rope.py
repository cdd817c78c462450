"""Multimodal RoPE (M-RoPE): 3-axis positions (time, row, col) for a prompt, and their cos/sin tables."""
import torch


def mrope_positions(token_types: list[int], grids: list[tuple[int, int, int]], merge: int,
                    t_scales: list[float | None] | None = None) -> tuple[torch.Tensor, int]:
    """get_rope_index semantics for one prompt: text tokens share one counter on all 3 axes; an image starting
    at counter p gets (p, p + row, p + col) on its merged grid and the counter then advances by max(rows, cols).
    A video's run has t > 1 frame pairs: its time axis is p + k, or p + int(k * scale) where a scale is given
    (Qwen2.5-VL: tokens_per_second x seconds per frame pair, multiplied in float32 as transformers does).
    grids / t_scales: one per run of placeholders. Returns positions [3, len] and the rope delta (decode
    position = sequence length + delta)."""
    pieces, pos, i, img = [], 0, 0, 0
    n = len(token_types)
    while i < n:
        j = i
        while j < n and token_types[j] == token_types[i]:
            j += 1
        if token_types[i] == 0:
            pieces.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos += j - i
        else:
            t, h, w = grids[img]
            scale = t_scales[img] if t_scales else None
            img += 1
            rows, cols = h // merge, w // merge
            steps = torch.arange(t)
            if scale is not None:
                steps = (steps * torch.tensor(scale, dtype=torch.float32)).long()
            tt = torch.zeros(t, rows, cols, dtype=torch.long) + steps.view(t, 1, 1)
            hh = torch.arange(rows).view(1, rows, 1).expand(t, rows, cols)
            ww = torch.arange(cols).view(1, 1, cols).expand(t, rows, cols)
            pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
            if pieces[-1].shape[1] != j - i:
                raise ValueError(f"vision run {img - 1} has {j - i} placeholder tokens but its grid gives "
                                 f"{pieces[-1].shape[1]}")
            pos += max(rows, cols)
        i = j
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions.max()) + 1 - n if n else 0
    return positions, delta


def axis_of_each_frequency(head_dim: int, sections: list[int], interleaved: bool) -> torch.Tensor:
    """For each rotary frequency, which position axis (0=t, 1=h, 2=w) drives it.
    Qwen2/2.5-VL: contiguous chunks [t..t, h..h, w..w]; Qwen3-VL: interleaved t,h,w,t,h,w,... (rest t)."""
    half = head_dim // 2
    if sum(sections) != half:
        raise ValueError(f"mrope_section {sections} must sum to head_dim/2 = {half}")
    if not interleaved:
        return torch.cat([torch.full((s,), a, dtype=torch.long) for a, s in enumerate(sections)])
    axis = torch.zeros(half, dtype=torch.long)
    for a in (1, 2):
        axis[a:sections[a] * 3:3] = a
    return axis


class MRotaryEmbedding(torch.nn.Module):
    """cos/sin for 3-axis positions, laid out like HF's rotate_half convention (freqs repeated twice)."""

    def __init__(self, head_dim: int, theta: float, sections: list[int], interleaved: bool):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("axis", axis_of_each_frequency(head_dim, sections, interleaved), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [3, T] -> cos, sin [T, head_dim]."""
        pos = positions[self.axis].T.float()  # [T, head_dim/2]: each frequency reads its own axis
        freqs = pos * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, 1, head_dim] (broadcast over heads)."""
    return x * cos + rotate_half(x) * sin


def rotate_partially(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first cos.shape[-1] channels of each head; the rest pass through (partial_rotary_factor)."""
    r = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)
