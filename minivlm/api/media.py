"""image_url parts -> image bytes for the engine. data: URLs are decoded here; http(s) URLs are fetched only from
domains the operator listed (--allowed-media-domains): by default the server fetches nothing (no SSRF)."""
import base64
import binascii
import urllib.error
import urllib.request
from urllib.parse import urlparse

from minivlm.api.errors import ApiError
from minivlm.api.protocol import ChatCompletionRequest, ImagePart

MAX_IMAGE_BYTES = 20 * 2**20   # per image, encoded
FETCH_TIMEOUT_S = 10


def data_url_bytes(url: str, param: str) -> bytes:
    """data:image/...;base64,... -> the encoded image bytes."""
    header, comma, data = url.partition(",")
    meta = header[len("data:"):].split(";")
    if not comma or "base64" not in meta[1:]:
        raise ApiError(400, "a data: image URL must be base64-encoded (data:image/png;base64,...)", param=param,
                       code="invalid_image_url")
    if not meta[0].startswith("image/"):
        raise ApiError(400, f"the data: URL holds {meta[0] or 'no media type'!r}, not an image/* type", param=param,
                       code="invalid_image_url")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ApiError(400, f"the image is over {MAX_IMAGE_BYTES // 2**20} MiB", param=param, code="image_too_large")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, f"the data: URL is not valid base64 ({e})", param=param, code="invalid_image") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None  # a redirect could lead off the allowed domains


def fetched_bytes(url: str, allowed_domains: list[str], param: str) -> bytes:
    """Download an http(s) image, only from an allowed domain (or its subdomains), size-capped, no redirects."""
    parsed = urlparse(url)
    host = (parsed.hostname or "").lower()
    allowed = any(host == d or host.endswith("." + d) for d in allowed_domains)
    if parsed.scheme not in ("http", "https") or not allowed:
        why = ("this server fetches no remote media; send the image as a data: URL" if not allowed_domains else
               f"only data: URLs and http(s) URLs on {', '.join(allowed_domains)} are allowed")
        raise ApiError(400, f"image URL {url[:100]!r} refused: {why}", param=param, code="image_url_not_allowed")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_IMAGE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ApiError(400, f"could not fetch image {url[:100]!r}: {e}", param=param, code="image_fetch_failed") \
            from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ApiError(400, f"the image is over {MAX_IMAGE_BYTES // 2**20} MiB", param=param, code="image_too_large")
    return data


def engine_messages(req: ChatCompletionRequest, allowed_domains: list[str]) -> list[dict]:
    """OpenAI messages -> HF-format messages with image bytes (may download: call it off the event loop)."""
    out = []
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if isinstance(part, ImagePart):
                    url, param = part.image_url.url, f"messages[{i}].content[{j}].image_url.url"
                    image = data_url_bytes(url, param) if url.startswith("data:") else \
                        fetched_bytes(url, allowed_domains, param)
                    parts.append({"type": "image", "image": image})
                else:
                    parts.append({"type": "text", "text": part.text})
            content = parts
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return out
