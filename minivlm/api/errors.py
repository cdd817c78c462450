"""OpenAI-format errors: {"error": {"message", "type", "param", "code"}} with the matching HTTP status."""
from fastapi.responses import JSONResponse

# engine refusals (ValueError) by a phrase of their message -> (code, param); the message itself is passed on
ENGINE_REFUSALS = [
    ("max_model_len", "context_length_exceeded", "messages"),
    ("KV blocks", "context_length_exceeded", "max_tokens"),
    ("limit per video", "video_too_large", "messages"),     # before the image phrases: a video's refusal says both
    ("limit of decoded frames", "video_too_large", "messages"),
    ("of frames together", "video_too_large", "messages"),
    ("cannot sample", "invalid_video", "messages"),
    ("not a readable video", "invalid_video", "messages"),
    ("too many videos", "too_many_videos", "messages"),
    ("takes no video", "invalid_video", "messages"),
    ("not a readable image", "invalid_image", "messages"),
    ("MP limit", "image_too_large", "messages"),
    ("MiB limit", "image_too_large", "messages"),
    ("zero size", "invalid_image", "messages"),
    ("too many images", "too_many_images", "messages"),
]


class ApiError(Exception):
    """A refused or failed request, as the client will see it."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_engine(error: Exception) -> ApiError:
    """An exception raised by the engine for one request, as an API error (the engine keeps serving)."""
    if isinstance(error, ValueError):
        message = str(error)
        code, param = next(((c, p) for phrase, c, p in ENGINE_REFUSALS if phrase in message), ("invalid_value", None))
        return ApiError(400, message, param=param, code=code)
    if isinstance(error, RuntimeError) and "closed" in str(error):
        return ApiError(503, "the engine was rebuilt while this request waited; send it again",
                        "service_unavailable_error", code="engine_rebuilt")
    return ApiError(500, f"the engine failed on this request ({type(error).__name__}: {error})", "server_error",
                    code="engine_error")
