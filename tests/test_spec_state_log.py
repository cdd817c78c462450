"""The step-through's decision log says, for a speculating request on a model with recurrent state (Qwen3.5), where
its state was put back (#55 item 5): the `speculated` event's `state_after` names the token whose state the request's
slot keeps. Checked against the state itself: after each speculating step the slot holds exactly the state that
decoding the same request without speculation had after that token (so a rejected guess was rolled back, and to the
right token); the sentences in English and Chinese; a model without recurrent state says nothing of it."""
import pytest
import torch

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.views.events import describe
from panels.i18n.events import describe_in

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = ["red red red red red blue red red red", "one two three one two three one two"]
MAX = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    return make_qwen3_5_checkpoint(str(tmp_path_factory.mktemp("spec_state") / "qwen3_5"), seed=3)


def states_by_length(path, prompt: str, spec=None) -> tuple[dict, dict, list]:
    """Run one request greedily; after every step, its slot's states (every recurrent layer's tensors) by the number
    of tokens fed so far, and by step; and the run's events."""
    seen, by_step = {}, {}
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=512, num_blocks=32,
                             speculative_config=spec)) as e:
        pool = e.core.pool.groups["recurrent"].tensors
        states = next(g for g in e.core.block_manager.managers if g.kind == "recurrent")

        def after(core):
            for seq_id, seq in core._step_seqs.items():
                if seq_id in states.slot_of:
                    slot = states.slot_of[seq_id]
                    seen[seq.num_computed] = by_step[core.step_count] = [t[:, slot].clone() for t in pool]
        e.core.after_step = after
        e.generate(Request(prompt=prompt), SamplingParams(max_tokens=MAX, ignore_eos=True))
        return seen, by_step, e.events()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_slot_keeps_the_state_the_event_names(checkpoint, prompt):
    plain, _, _ = states_by_length(checkpoint, prompt)
    _, spec, events = states_by_length(checkpoint, prompt, SPEC)
    said = [ev for ev in events if ev.kind == "speculated"]
    rejected = [ev for ev in said if ev.accepted < len(ev.draft)]
    assert said and rejected, "no guess was rejected: nothing was rolled back"
    for ev in said:
        k = ev.state_after
        mine = spec[ev.step]  # the slot after the event's step
        want = plain[k + 1]
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(mine, want)), (ev, k)
        # and not the state one token either side (the check tells an off-by-one rollback)
        for other in (k, k + 2):
            if other in plain:
                assert not all(torch.allclose(a, b, atol=1e-5) for a, b in zip(mine, plain[other]))


def test_the_decision_log_says_it_in_both_languages(checkpoint):
    _, _, events = states_by_length(checkpoint, PROMPTS[0], SPEC)
    said = [ev for ev in events if ev.kind == "speculated"]
    ev = next(ev for ev in said if ev.accepted < len(ev.draft))
    n = len(ev.draft) - ev.accepted
    line = describe(ev)
    assert line.endswith(f"; recurrent state kept after token {ev.state_after}, {n} rejected guess(es) rolled back")
    assert describe_in(ev, "en") == line
    assert f"循环状态保留在第 {ev.state_after} 个 token 之后，回滚了 {n} 个被拒绝的猜测" in describe_in(ev, "zh-CN")
    for ev in (e for e in said if e.accepted == len(e.draft)):  # every guess kept: the state runs on
        assert describe(ev).endswith(f"; recurrent state after token {ev.state_after}: every guess kept, nothing "
                                     f"rolled back") and "猜测全部接受，无需回滚" in describe_in(ev, "zh-CN")
    from panels.decisions import decision_log
    assert "rolled back" in decision_log(events) and "回滚" in decision_log(events, lang="zh-CN")


def test_a_model_without_recurrent_state_says_nothing_of_it():
    with Engine(EngineConfig(device="cpu", dtype="float32", num_blocks=32, speculative_config=SPEC)) as e:
        e.generate(Request(prompt=PROMPTS[1]), SamplingParams(max_tokens=12, ignore_eos=True))
        said = [ev for ev in e.events() if ev.kind == "speculated"]
    assert said and all(ev.state_after is None for ev in said)
    assert not any("recurrent state" in describe(ev) or "循环状态" in describe_in(ev, "zh-CN") for ev in said)
