"""Images in: loaded from a PIL image, bytes or a path, checked from the header first (image_limits), decoded
upright in RGB, and hashed by content (the hash that keys B and C of the prefix cache)."""
import hashlib

from PIL import Image, ImageOps

from minivlm.inputs import image_limits


def load_image(obj, max_pixels: int | None = None) -> tuple[Image.Image, list[str]]:
    """PIL image, encoded bytes or a file path -> RGB image (EXIF-rotated, first frame), plus notes for the user;
    checked from its header first (minivlm.inputs.image_limits) and decoded no larger than `max_pixels` needs."""
    return load_images([obj], max_pixels)[0]


def load_images(raw: list, max_pixels: int | None = None) -> list[tuple[Image.Image, list[str]]]:
    """A request's images: every header checked (each image, then all together) before any pixel is decoded;
    each then decoded within the server's budget and no larger than a processor using `max_pixels` needs."""
    keep = image_limits.keep_pixels(max_pixels)
    out = []
    for i, (opened, pixels) in enumerate(image_limits.open_all(raw, keep)):
        if opened is None:
            img, notes, upright = raw[i], [], False
        else:
            img, notes, upright = image_limits.decode(opened, pixels, keep, image_limits.image_name(raw[i], i))
        if getattr(img, "n_frames", 1) > 1:
            notes.append(f"animated image: used the first of {img.n_frames} frames")
            img.seek(0)
            img = img.copy()
        if not upright:
            img = ImageOps.exif_transpose(img)
        if img.mode != "RGB":
            notes.append(f"converted {img.mode} image to RGB")
            img = to_rgb(img)
        out.append((img, notes))
    return out


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB; transparency composited on white, 16-bit scaled down to 8-bit."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        img = img.point(lambda v: v / 256).convert("L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGB", img.size, (255, 255, 255))
        background.paste(img.convert("RGBA"), mask=img.convert("RGBA").getchannel("A"))
        return background
    return img.convert("RGB")


def content_hash(img: Image.Image) -> str:
    """Hash of decoded pixels + size + mode: the same picture hashes the same whatever its file format."""
    h = hashlib.sha256()
    h.update(repr((img.mode, img.size)).encode())
    h.update(img.tobytes())
    return h.hexdigest()
