"""One request lifecycle: every status a request passes, recorded where it is written (lifecycle.py), on a real
engine whose pool is too small for its requests (so one is preempted and re-admitted), plus every way to finish."""
import pytest

from minivlm import Engine, EngineConfig, Request, RequestFailed, SamplingParams
from minivlm.engine.lifecycle import RequestRegistry
from minivlm.engine.request import RequestStatus as S
from minivlm.engine.sequence import Sequence
from tests.faults import inject
from tests.test_engine import mixed_requests


@pytest.fixture
def transitions(monkeypatch):
    """(request_id, status) for every status written, in order."""
    seen = []
    real = Sequence.set_status

    def record(self, status):
        real(self, status)
        seen.append((self.request_id, status))
    monkeypatch.setattr(Sequence, "set_status", record)
    return seen


def path(seen, rid) -> list:
    return [s for r, s in seen if r == rid]


def test_a_preempted_request_walks_every_status(checkpoints, transitions):
    reqs = mixed_requests()
    with Engine(EngineConfig(model=checkpoints["qwen2_5_vl"], num_blocks=9, block_size=8,
                             cache_strategy="none")) as engine:
        engine.generate(reqs, SamplingParams(max_tokens=24, ignore_eos=True))
        preempted = {e.request_id for e in engine.events() if e.kind == "preempted"}
        assert preempted, "the pool was meant to be too small for all requests at once"
        assert not engine.core.requests.requests and not engine.has_unfinished()
    for r in reqs:
        p = path(transitions, r.request_id)
        assert p[:2] == [S.WAITING, S.RUNNING] and p[-1] == S.FINISHED_LENGTH_CAPPED
        if r.request_id in preempted:  # preempted (back in line, first), re-admitted, and on to the end
            assert S.PREEMPTED in p
            i = p.index(S.PREEMPTED)
            assert p[i + 1] == S.RUNNING
        else:
            assert p == [S.WAITING, S.RUNNING, S.FINISHED_LENGTH_CAPPED]
    assert any(S.PREEMPTED in path(transitions, r.request_id) for r in reqs)


def test_every_finish_is_a_status_and_its_finish_reason(checkpoints, transitions, monkeypatch):
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], num_blocks=64)) as engine:
        out = engine.generate(Request(prompt="Hello there.", request_id="capped"), SamplingParams(max_tokens=3))
        assert out.finish_reason == "length" and path(transitions, "capped")[-1] == S.FINISHED_LENGTH_CAPPED
        # a stop string: FINISHED_STOPPED, whatever the random weights write (their first token's text)
        first = engine.generate(Request(prompt="Hello there."), SamplingParams(max_tokens=1)).text
        out = engine.generate(Request(prompt="Hello there.", request_id="stopped"),
                              SamplingParams(max_tokens=8, stop=[first]))
        assert out.finish_reason == "stop" and path(transitions, "stopped")[-1] == S.FINISHED_STOPPED
        stream = engine.stream(Request(prompt="Hello there.", request_id="aborted"),
                               SamplingParams(max_tokens=50, ignore_eos=True))
        next(stream)
        stream.close()  # the caller goes away: aborted at the next step
        while engine.has_unfinished():
            pass
        assert path(transitions, "aborted")[-1] == S.FINISHED_ABORTED
        inject(monkeypatch, engine, "model run", lambda rid: rid == "failed")
        with pytest.raises(RequestFailed):
            engine.generate(Request(prompt="Hello there.", request_id="failed"), SamplingParams(max_tokens=4))
        assert path(transitions, "failed") == [S.WAITING, S.RUNNING, S.FINISHED_ERROR]
        assert not engine.core.requests.requests and not engine.snapshot().block_tables


def test_only_the_allowed_transitions_are_taken():
    reg = RequestRegistry()

    class Seq:  # what the registry needs of a Sequence
        def __init__(self):
            self.seq_id, self.request_id, self.status = 7, "r", None

        def set_status(self, s):
            self.status = s
    seq = Seq()
    with pytest.raises(RuntimeError, match="no transition None -> RequestStatus.RUNNING"):
        reg.run(seq)
    reg.add(seq)
    assert seq.status == S.WAITING and list(reg.waiting) == [seq] and reg.get(7) is seq
    with pytest.raises(RuntimeError, match="WAITING -> RequestStatus.PREEMPTED"):
        reg.preempt(seq)
    reg.run(seq)
    assert list(reg.running) == [seq] and not reg.waiting
    reg.preempt(seq)
    assert seq.status == S.PREEMPTED and list(reg.waiting) == [seq] and reg.num_preemptions == 1
    reg.run(seq)
    reg.finish(seq, "stop")
    assert seq.status == S.FINISHED_STOPPED and 7 not in reg and not reg.has_work()
    with pytest.raises(RuntimeError, match="FINISHED_STOPPED -> RequestStatus.FINISHED_ABORTED"):
        reg.finish(seq, "abort")  # finished is final
    assert [s.finish_reason for s in S] == [None, None, None, "stop", "length", "abort", "error"]
