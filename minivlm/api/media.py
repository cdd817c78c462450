"""image_url parts -> image bytes for the engine. data: URLs are decoded here; http(s) URLs are fetched only from
domains the operator listed (--allowed-media-domains): by default the server fetches nothing (no SSRF)."""
import base64
import binascii
import json
import urllib.error
import urllib.request
from urllib.parse import urlparse

from minivlm.api.errors import ApiError
from minivlm.api.protocol import ChatCompletionRequest, ImagePart, VideoPart
from minivlm.inputs.image_limits import MAX_IMAGE_BYTES  # per image, encoded: the same limit as the UI's uploads
from minivlm.inputs.video import MAX_VIDEO_BYTES

FETCH_TIMEOUT_S = 10


def too_large(size: str, param: str) -> ApiError:
    """The engine's own words for an encoded image over the limit (the same message as in the UI)."""
    return ApiError(400, f"the image is {size}, over the {MAX_IMAGE_BYTES // 2**20} MiB limit per image; send a "
                         f"smaller file", param=param, code="image_too_large")


def data_url_bytes(url: str, param: str, video: bool = False) -> bytes:
    """data:image/...;base64,... (a video: data:video/...;base64,... or an animated image) -> the encoded bytes."""
    header, comma, data = url.partition(",")
    meta = header[len("data:"):].split(";")
    kind = "video" if video else "image"
    if not comma or "base64" not in meta[1:]:
        raise ApiError(400, f"a data: {kind} URL must be base64-encoded (data:{'video/mp4' if video else 'image/png'}"
                            f";base64,...)", param=param, code=f"invalid_{kind}_url")
    if not meta[0].startswith("image/") and not (video and meta[0].startswith("video/")):
        raise ApiError(400, f"the data: URL holds {meta[0] or 'no media type'!r}, not an "
                            f"{'video/* or image/*' if video else 'image/*'} type", param=param,
                       code=f"invalid_{kind}_url")
    if video and len(data) > MAX_VIDEO_BYTES * 4 // 3 + 4:
        raise ApiError(400, f"the video is about {len(data) * 3 / 4 / 2**20:.1f} MiB, over the "
                            f"{MAX_VIDEO_BYTES // 2**20} MiB limit per video; send a shorter or smaller file",
                       param=param, code="video_too_large")
    if not video and len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise too_large(f"about {len(data) * 3 / 4 / 2**20:.1f} MiB", param)
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
        raise too_large(f"over {MAX_IMAGE_BYTES // 2**20} MiB", param)
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
                    if m.role != "user":  # as OpenAI: images only in user turns
                        raise ApiError(400, f"messages[{i}] is a {m.role!r} message: image_url parts are only "
                                            f"allowed in user messages", param=f"messages[{i}].content[{j}]",
                                       code="invalid_image_role")
                    url, param = part.image_url.url, f"messages[{i}].content[{j}].image_url.url"
                    image = data_url_bytes(url, param) if url.startswith("data:") else \
                        fetched_bytes(url, allowed_domains, param)
                    parts.append({"type": "image", "image": image})
                elif isinstance(part, VideoPart):
                    param = f"messages[{i}].content[{j}].video_url.url"
                    if m.role != "user" or not part.video_url.url.startswith("data:"):
                        raise ApiError(400, "video_url parts are taken in user messages, as data: URLs "
                                            "(data:video/mp4;base64,...)", param=param, code="invalid_video_url")
                    video = {"type": "video", "video": data_url_bytes(part.video_url.url, param, video=True)}
                    kw = req.mm_processor_kwargs
                    video.update({k: v for k, v in (("fps", kw and kw.fps), ("num_frames", kw and kw.num_frames))
                                  if v is not None})
                    parts.append(video)
                else:
                    parts.append({"type": "text", "text": part.text})
            content = parts
        turn = {"role": "system" if m.role == "developer" else m.role, "content": "" if content is None else content}
        if m.tool_calls:
            turn["tool_calls"] = [template_call(c, f"messages[{i}].tool_calls[{j}].function.arguments")
                                  for j, c in enumerate(m.tool_calls)]
        if m.tool_call_id is not None:
            turn["tool_call_id"] = m.tool_call_id
        out.append(turn)
    return out


def template_call(tool_call, param: str) -> dict:
    """A tool call of an earlier turn as chat templates read it: arguments as a dict (vLLM parses them too)."""
    try:
        arguments = json.loads(tool_call.function.arguments)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"{param} is not JSON ({e})", param=param, code="invalid_value") from None
    return {"id": tool_call.id, "type": "function",
            "function": {"name": tool_call.function.name, "arguments": arguments}}
