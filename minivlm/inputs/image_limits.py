"""What an image may cost, checked from its header before any pixel is decoded: the encoded size (one upload limit
for the UI and the API), its pixels, the pixels of all images of one request together, and the pixels the whole
server decodes at once. Then decode no larger than the processor will use: JPEG's draft mode scales while
decoding, other formats are reduced by a whole factor right after decoding (the processor resizes the rest).
Every route (chat, inspector, anatomy, API, library) comes through here, so a refusal reads the same everywhere."""
import io
import math
import os
import re
import threading
import warnings

from PIL import Image, UnidentifiedImageError

MAX_IMAGE_BYTES = 20 * 2**20         # one encoded image (an upload in the UI, a data: URL or a fetch in the API)
MAX_IMAGE_PIXELS = 64_000_000        # one image, from its header (decompression bombs)
MAX_REQUEST_PIXELS = 64_000_000      # all images of one request together, as they will be decoded
MAX_SERVER_PIXELS = 128_000_000      # all requests' images being decoded at the same moment
SERVER_WAIT_S = 30.0                 # a request waits this long for the server's decoding room, then is refused
KEEP_PIXELS = 2_000_000              # never reduce an image below this many pixels (or 4x what the processor uses)
FORMATS = "PNG, JPEG, WebP or GIF"

TOO_LARGE = "over the"  # every size refusal says "... over the <limit> limit ..." (the API maps it to image_too_large)


def mp(pixels: int) -> str:
    return f"{pixels / 1e6:.0f} MP" if pixels >= 1e6 else f"{pixels / 1e6:.2f} MP"


def image_name(obj, index: int) -> str:
    """How a refusal names an image: its position in the request, and its file's name when it has one."""
    if isinstance(obj, (str, os.PathLike)):
        return f"image {index + 1} ({os.path.basename(str(obj))})"
    return f"image {index + 1}"


def _detail(error: Exception) -> str:
    """PIL's reason in the user's words: without the server's object reprs and temp paths (PIL's
    "cannot identify image file" just repeats what the refusal already says)."""
    if isinstance(error, UnidentifiedImageError):
        return ""
    text = re.sub(r"<_io\.\w+ object at 0x[0-9a-f]+>|'[^']*'", "the data", str(error))
    return f" ({type(error).__name__}: {text})" if text else f" ({type(error).__name__})"


def encoded_size(obj, name: str, what: str, limit: int, advice: str) -> int:
    """The encoded size of a file path or bytes, refused over `limit` (one wording for images and videos)."""
    if isinstance(obj, (str, os.PathLike)):
        if not os.path.isfile(obj):
            raise ValueError(f"{what} path {str(obj)[:200]!r} does not exist")
        size = os.path.getsize(obj)
    else:
        size = len(obj)
    if size > limit:
        raise ValueError(f"{name} is {size / 2**20:.1f} MiB, over the {limit // 2**20} MiB limit per {what}; {advice}")
    return size


def open_header(obj, name: str) -> Image.Image:
    """A lazily opened image (nothing decoded yet), its encoded size and pixels checked."""
    encoded_size(obj, name, "image", MAX_IMAGE_BYTES, "send a smaller file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # we check the size ourselves
            img = Image.open(io.BytesIO(obj) if isinstance(obj, (bytes, bytearray)) else obj)
    except Image.DecompressionBombError as e:  # PIL's own cap (twice its warning size), far above ours
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = int(found.group(1)) if found else MAX_IMAGE_PIXELS + 1
        raise ValueError(f"{name} is {mp(pixels)}, over the {mp(MAX_IMAGE_PIXELS)} limit per image; downscale it "
                         f"first") from None
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError, ValueError) as e:
        raise ValueError(f"{name} is not a readable image: not a {FORMATS} file, or damaged{_detail(e)}") \
            from None
    check_size(*img.size, name=name)
    return img


def check_file(path: str, name: str):
    """The header check alone, for a page's upload before it is used (the same limits and words)."""
    open_header(path, name).close()


def check_size(width: int, height: int, name: str = "the image"):
    if width < 1 or height < 1:
        raise ValueError(f"{name} has zero size ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"{name} is {width}x{height} = {mp(width * height)}, over the {mp(MAX_IMAGE_PIXELS)} limit "
                         f"per image; downscale it first")


def keep_pixels(target: int | None) -> int | None:
    """The fewest pixels an image is decoded to, for a processor that uses at most `target` (None: all)."""
    return None if not target else max(4 * target, KEEP_PIXELS)


def processor_pixels(processor, mm_kwargs: dict | None) -> int | None:
    """The most pixels of one image the processor will use for this request (None when it cannot tell)."""
    ip = getattr(processor, "image_processor", None)
    size = getattr(ip, "size", None)
    longest = size.get("longest_edge") if isinstance(size, dict) else getattr(size, "longest_edge", None)
    if not isinstance(longest, int) or longest < 1:
        return None
    # Qwen-VL processors name their pixel budget longest_edge; others (Idefics3, SmolVLM) mean an edge in pixels
    default = longest if hasattr(ip, "merge_size") else longest * longest
    kw = mm_kwargs or {}
    asked = kw.get("max_pixels")
    edge = kw.get("size", {}).get("longest_edge") if isinstance(kw.get("size"), dict) else kw.get("size")
    if isinstance(edge, int) and not hasattr(ip, "merge_size"):  # a tiled family asked for a longer edge
        default = max(default, edge * edge)
    return max(default, int(asked)) if isinstance(asked, (int, float)) else default


def plan(img: Image.Image, keep: int | None) -> int:
    """Ask the decoder for no more than needed (JPEG: draft scales by 1/2, 1/4 or 1/8 while decoding); returns
    the pixels decoding will produce."""
    w, h = img.header_size = img.size
    if keep and img.format == "JPEG" and w * h > 2 * keep:
        r = math.sqrt(keep / (w * h))
        img.draft("RGB" if img.mode not in ("L", "RGB") else img.mode, (math.ceil(w * r), math.ceil(h * r)))
    return img.size[0] * img.size[1]


def reduce(img: Image.Image, keep: int | None) -> Image.Image:
    """A decoded image reduced by a whole factor (box averaging) when that still leaves `keep` pixels."""
    w, h = img.size
    factor = int(math.sqrt(w * h / keep)) if keep else 1
    if factor < 2:
        return img
    if img.mode not in ("L", "LA", "RGB", "RGBA", "I", "F"):
        img = img.convert("RGBA" if img.mode in ("P", "PA") or "transparency" in img.info else
                          "L" if img.mode == "1" else "RGB")
    return img.reduce(factor)


class PixelBudget:
    """Pixels being decoded across the server at once: a request waits for room, or is refused after a while."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()

    def acquire(self, pixels: int, name: str, timeout: float = SERVER_WAIT_S):
        with self.cond:
            if not self.cond.wait_for(lambda: self.used + pixels <= self.limit or self.used == 0, timeout):
                raise ValueError(f"the server is decoding {mp(self.used)} of other requests' images, and {name} "
                                 f"needs {mp(pixels)}: over the {mp(self.limit)} limit at once; try again shortly")
            self.used += pixels

    def release(self, pixels: int):
        with self.cond:
            self.used -= pixels
            self.cond.notify_all()


SERVER = PixelBudget(MAX_SERVER_PIXELS)


def open_all(raw: list, keep: int | None) -> list[tuple[Image.Image | None, int]]:
    """Every image's header checked, then the request's total: (lazily opened image or None for a PIL image
    given as is, pixels it will decode to). Nothing is decoded yet."""
    opened, names = [], []
    for i, obj in enumerate(raw):
        name = image_name(obj, i)
        names.append(name)
        if isinstance(obj, Image.Image):
            check_size(*obj.size, name=name)
            opened.append((None, 0))  # already decoded by the caller
        elif isinstance(obj, (bytes, bytearray, str, os.PathLike)):
            img = open_header(obj, name)
            opened.append((img, plan(img, keep)))
        else:
            raise ValueError(f"an image must be a PIL.Image, encoded bytes or a file path, got {type(obj).__name__}")
    total = sum(p for _, p in opened)
    if total > MAX_REQUEST_PIXELS:
        parts = " + ".join(f"{n} {mp(p)}" for n, (_, p) in zip(names, opened) if p)
        raise ValueError(f"the images of this request are {mp(total)} together ({parts}), over the "
                         f"{mp(MAX_REQUEST_PIXELS)} limit per request; send fewer or smaller images")
    return opened


EXIF_TURNS = {2: [Image.Transpose.FLIP_LEFT_RIGHT], 3: [Image.Transpose.ROTATE_180],
              4: [Image.Transpose.FLIP_TOP_BOTTOM], 5: [Image.Transpose.TRANSPOSE], 6: [Image.Transpose.ROTATE_270],
              7: [Image.Transpose.TRANSVERSE], 8: [Image.Transpose.ROTATE_90]}


def decode(img: Image.Image, pixels: int, keep: int | None, name: str) -> tuple[Image.Image, list[str], bool]:
    """Decode one opened image within the server's budget and reduce it at once: (image, notes, reduced). A
    reduced image is already turned upright by its EXIF orientation (the original's metadata stays behind)."""
    SERVER.acquire(pixels, name)
    try:
        try:
            img.load()
            orientation = img.getexif().get(0x0112, 1) if img.format == "JPEG" else 1
        except (OSError, SyntaxError, EOFError, ValueError) as e:
            raise ValueError(f"{name} is not a readable image: not a {FORMATS} file, or damaged{_detail(e)}") \
                from None
        small = reduce(img, keep)
        (w, h), (sw, sh) = getattr(img, "header_size", img.size), small.size
        notes = [f"large image: decoded at {sw}×{sh} instead of {w}×{h} (the processor scales it down further)"] \
            if (sw, sh) != (w, h) else []
        if small is img:
            return img, notes, False
        for turn in EXIF_TURNS.get(orientation, []):
            small = small.transpose(turn)
        return small, notes, True
    finally:
        SERVER.release(pixels)
