"""The event log's public path, as docs/API.md has always promised it (`from minivlm.events import replay`): the
views live in minivlm/views/events.py, the log itself in minivlm/engine/event_log.py."""
from minivlm.engine.event_log import EngineEvent, EventLog, to_jsonl  # noqa: F401
from minivlm.views.events import by_step, describe, describe_plan, describe_step, replay, replay_steps  # noqa: F401
