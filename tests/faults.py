"""Fault injection at each stage of an engine step, by wrapping the real function that stage calls."""
import functools

STAGES = ("admit", "schedule", "vision encode", "model run", "sampling", "advance", "snapshot")


class InjectedFault(RuntimeError):
    pass


def _target(engine, stage: str):
    """(object, method name, how to find the requests in its first argument) for a stage."""
    core = engine.core
    one, many = (lambda a: [a]), (lambda a: list(a))
    return {"admit": (core.requests, "add", one), "schedule": (core.block_manager, "allocate", one),
            "vision encode": (core.runner, "encode_images", many), "model run": (core.runner, "forward", many),
            "sampling": (core.runner, "sample_tokens", many), "advance": (core.outputs, "advance", one),
            "snapshot": (core.snapshots, "build", many)}[stage]


def inject(monkeypatch, engine, stage: str, doomed):
    """From now on, `stage` raises whenever it handles a request for which doomed(request_id) is true."""
    obj, name, requests_in = _target(engine, stage)
    real = getattr(obj, name)

    @functools.wraps(real)
    def faulty(first, *args, **kwargs):
        if any(doomed(seq.request_id) for seq in requests_in(first)):
            raise InjectedFault(f"injected fault in {stage}")
        return real(first, *args, **kwargs)
    monkeypatch.setattr(obj, name, faulty)
