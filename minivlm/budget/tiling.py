"""How many LLM tokens an image becomes in the tiled families, each by its own processor's rule (transformers 5).

SmolVLM / Idefics3 (SmolVLMImageProcessor): resize the longest edge to size.longest_edge (up or down, the other side
to an even number, capped at 4096), round both sides up to multiples of the tile side (max_image_size.longest_edge),
cut rows x cols tiles and add one global image (splitting off, or a one-tile image: the global image alone); each
tile is image_seq_len tokens. InternVL (GotOcr2ImageProcessor, crop_to_patches): pick the cols x rows grid of
min..max tiles whose aspect ratio is closest to the image's, resize to it, cut 448-px tiles, add a thumbnail when
there is more than one; each tile is image_seq_length tokens.
"""
import math
from dataclasses import dataclass

MAX_IMAGE_SIZE = 4096  # SmolVLM's absolute cap on the resized longest edge


@dataclass(frozen=True)
class TiledImage:
    """One image's tiling: grid rows x cols (0 x 0: no split), tiles fed to the tower (global / thumbnail included),
    the size the grid was cut from (height, width), and the prompt's placeholder and marker tokens."""
    rows: int
    cols: int
    tiles: int
    resized: tuple[int, int]
    vision_tokens: int
    marker_tokens: int


def _longest_edge(height: int, width: int, max_len: int) -> tuple[int, int]:
    """SmolVLM's resize: the longest edge to max_len, the other by the aspect ratio, truncated, then made even."""
    aspect = width / height
    if width >= height:
        width, height = max_len, int(max_len / aspect)
        height += height % 2
    else:
        height, width = max_len, int(max_len * aspect)
        width += width % 2
    return max(height, 1), max(width, 1)


def _below_cap(height: int, width: int, cap: int = MAX_IMAGE_SIZE) -> tuple[int, int]:
    """Shrink (truncating) so the longest edge is at most the cap."""
    aspect = width / height
    if width >= height and width > cap:
        width, height = cap, int(cap / aspect)
    elif height > width and height > cap:
        height, width = cap, int(cap * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple(height: int, width: int, tile: int) -> tuple[int, int]:
    """SmolVLM's resize_for_vision_encoder: the longest side up to a tile multiple, the other from the aspect ratio,
    then also up to a tile multiple."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def smolvlm_tiles(height: int, width: int, longest_edge: int, tile: int, image_seq_len: int,
                  splitting: bool = True) -> TiledImage:
    """SmolVLM / Idefics3 tiling of one height x width image. Markers: <fake_token_around_image> + <row_r_col_c>
    before each tile, a newline after each row, and "\\n<fake_token_around_image><global-img>" ...
    "<fake_token_around_image>" around the global image (runs of newlines counted as one token)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    h, w = _below_cap(*_longest_edge(height, width, longest_edge))
    if splitting:
        h, w = _tile_multiple(h, w, tile)
    rows, cols = (h // tile, w // tile) if splitting and (h > tile or w > tile) else (0, 0)
    tiles = rows * cols + 1
    markers = 2 * rows * cols + rows + 3 if rows else 3  # the last row's newline and the global's are one run
    return TiledImage(rows, cols, tiles, (h, w) if splitting else (tile, tile), tiles * image_seq_len, markers)


def tile_grids(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """Every (cols, rows) with min..max tiles, by tile count (a stable sort, as GotOcr2 orders them)."""
    grids = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1) if min_tiles <= c * r <= max_tiles]
    return sorted(grids, key=lambda g: g[0] * g[1])


def closest_grid(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """GotOcr2's get_optimal_tiled_canvas: the grid closest in aspect ratio; on a tie the later (more tiles) one,
    while the image's area exceeds half the grid's."""
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in tile_grids(min_tiles, max_tiles):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * tile * tile * cols * rows:
            best = (cols, rows)
    return best


def internvl_tiles(height: int, width: int, tile: int, image_seq_length: int, min_tiles: int = 1,
                   max_tiles: int = 12, crop_to_patches: bool = True) -> TiledImage:
    """InternVL tiling of one height x width image; markers are <img> and </img>."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    cols, rows = closest_grid(height, width, tile, min_tiles, max_tiles) if crop_to_patches and max_tiles > 1 \
        else (1, 1)
    tiles = cols * rows + (1 if cols * rows > 1 else 0)
    return TiledImage(rows, cols, tiles, (rows * tile, cols * tile), tiles * image_seq_length, 2)
