"""minivlm's OpenAI-compatible HTTP API and Prometheus metrics, as a FastAPI router over an engine getter.

    from minivlm.api import ApiSettings, create_router
    app.include_router(create_router(lambda: engine, ApiSettings(api_keys=["secret"])))
"""
from minivlm.api.server import ApiSettings, create_router

__all__ = ["ApiSettings", "create_router"]
