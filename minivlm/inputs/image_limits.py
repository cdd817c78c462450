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

from minivlm.refusals import Name, Refused

MAX_IMAGE_BYTES = 20 * 2**20         # one encoded image (an upload in the UI, a data: URL or a fetch in the API)
MAX_IMAGE_PIXELS = 64_000_000        # one image, from its header (decompression bombs)
MAX_REQUEST_PIXELS = 64_000_000      # all images of one request together, as they will be decoded
MAX_SERVER_PIXELS = 128_000_000      # all requests' images being decoded at the same moment
SERVER_WAIT_S = 30.0                 # a request waits this long for the server's decoding room, then is refused
KEEP_PIXELS = 2_000_000              # never reduce an image below this many pixels (or 4x what the processor uses)
FORMATS = "PNG, JPEG, WebP or GIF"

# the refusals a person meets, in English with their {fields} (a page says them again from the fields: error.<reason>)
FILE_TOO_LARGE = "{name} is {size} MiB, over the {limit} MiB limit per {kind}; {advice}"
IMAGE_PIXELS = "{name} is {pixels}, over the {limit} limit per image; downscale it first"
IMAGE_PIXELS_WH = "{name} is {size} = {pixels}, over the {limit} limit per image; downscale it first"
REQUEST_PIXELS = "the images of this request are {total} together ({parts}), over the {limit} limit per request; " \
                 "send fewer or smaller images"
SERVER_BUSY = "the server is decoding {used} of other requests' images, and {name} needs {pixels}: over the {limit} " \
              "limit at once; try again shortly"
NOT_AN_IMAGE = "{name} is not a readable image: not a {formats} file, or damaged{detail}"
ZERO_SIZE = "{name} has zero size ({size})"


def mp(pixels: int) -> str:
    return f"{pixels / 1e6:.0f} MP" if pixels >= 1e6 else f"{pixels / 1e6:.2f} MP"


def image_name(obj, index: int) -> Name:
    """How a refusal names an image: its position in the request, and its file's name when it has one."""
    return Name("image", index + 1, os.path.basename(str(obj)) if isinstance(obj, (str, os.PathLike)) else None)


def _detail(error: Exception) -> str:
    """PIL's reason in the user's words: without the server's object reprs and temp paths (PIL's
    "cannot identify image file" just repeats what the refusal already says)."""
    if isinstance(error, UnidentifiedImageError):
        return ""
    text = re.sub(r"<_io\.\w+ object at 0x[0-9a-f]+>|'[^']*'", "the data", str(error))
    return f" ({type(error).__name__}: {text})" if text else f" ({type(error).__name__})"


def encoded_size(obj, name: str, kind: str, limit: int, advice: str) -> int:
    """The encoded size of a file path or bytes, refused over `limit` (one wording for images and videos: `kind`)."""
    if isinstance(obj, (str, os.PathLike)):
        if not os.path.isfile(obj):
            raise Refused(f"invalid_{kind}", "{kind} path {path} does not exist", reason=f"no_such_{kind}", kind=kind,
                          path=repr(str(obj)[:200]))
        size = os.path.getsize(obj)
    else:
        size = len(obj)
    if size > limit:
        raise Refused(f"{kind}_too_large", FILE_TOO_LARGE, reason=f"{kind}_file_too_large", name=name,
                      size=f"{size / 2**20:.1f}", limit=limit // 2**20, kind=kind, advice=advice)
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
        raise Refused("image_too_large", IMAGE_PIXELS, reason="image_pixels", name=name, pixels=mp(pixels),
                      limit=mp(MAX_IMAGE_PIXELS)) from None
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError, ValueError) as e:
        raise not_an_image(name, e) from None
    check_size(*img.size, name=name)
    return img


def check_file(path: str, name: str):
    """The header check alone, for a page's upload before it is used (the same limits and words)."""
    open_header(path, name).close()


def not_an_image(name: str, error: Exception) -> Refused:
    return Refused("invalid_image", NOT_AN_IMAGE, reason="not_an_image", name=name, formats=FORMATS,
                   detail=_detail(error))


def check_size(width: int, height: int, name: str = "the image"):
    if width < 1 or height < 1:
        raise Refused("invalid_image", ZERO_SIZE, reason="zero_size", name=name, size=f"{width}x{height}")
    if width * height > MAX_IMAGE_PIXELS:
        raise Refused("image_too_large", IMAGE_PIXELS_WH, reason="image_pixels_wh", name=name, size=f"{width}x{height}",
                      pixels=mp(width * height), limit=mp(MAX_IMAGE_PIXELS))


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
                raise Refused("image_too_large", SERVER_BUSY, reason="server_busy", used=mp(self.used), name=name,
                              pixels=mp(pixels), limit=mp(self.limit))
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
            raise Refused("invalid_image", "an image must be a PIL.Image, encoded bytes or a file path, got {type}",
                          reason="image_type", type=type(obj).__name__)
    total = sum(p for _, p in opened)
    if total > MAX_REQUEST_PIXELS:
        parts = [(n, mp(p)) for n, (_, p) in zip(names, opened) if p]  # written "image 1 (a.png) 40 MP + ..."
        raise Refused("image_too_large", REQUEST_PIXELS, reason="request_pixels", total=mp(total), parts=parts,
                      limit=mp(MAX_REQUEST_PIXELS))
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
            raise not_an_image(name, e) from None
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
