"""OpenAI-format errors: {"error": {"message", "type", "param", "code"}} with the matching HTTP status."""
from fastapi.responses import JSONResponse

from minivlm.refusals import EngineClosed, Refused


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
    """An exception raised by the engine for one request, as an API error (the engine keeps serving): a refusal is
    a 400 with its own code and param (never read from its wording), a closed engine a 503, anything else a 500."""
    cause = getattr(error, "cause", None)  # a request that failed mid-answer because of its own input (a grammar
    if isinstance(cause, Refused):         # that ran out of budget) is the client's error, said as at intake
        error = cause
    if isinstance(error, Refused):
        return ApiError(400, str(error), param=error.param, code=error.code)
    if isinstance(error, ValueError):  # a value the engine checks without a refusal's code (SamplingParams)
        return ApiError(400, str(error), code="invalid_value")
    if isinstance(error, EngineClosed):
        return ApiError(503, "the engine was rebuilt while this request waited; send it again",
                        "service_unavailable_error", code="engine_rebuilt")
    return ApiError(500, f"the engine failed on this request ({type(error).__name__}: {error})", "server_error",
                    code="engine_error")
