"""Executing one plan, exactly as written, in the runner's two phases (vLLM's execute_model / sample_tokens):
`execute_model` frees the encoder outputs the plan frees, encodes its images and runs the forward for its live
requests; `sample_tokens` verifies speculating requests' guesses and samples for those whose prefill completes,
within their grammars' masks. A stage that raises is retried one request at a time (plan.only: the same items, fewer
of them); the requests that fail alone are written into the RunnerOutput's `failed`, as data: the core fails them
between the phases and after (it alone knows which requests are alive). Nothing here re-plans and nothing here
touches the core: a request whose forward read K/V that were never written (the core says which, between the
phases) samples nothing, and EngineCore.update rewinds it."""
import itertools
import logging

import torch

from minivlm.engine.scheduling.plan import RunnerOutput, StepPlan
from minivlm.engine.step_result import all_or_none, isolate

log = logging.getLogger("minivlm")


def execute_model(runner, plan: StepPlan, live) -> RunnerOutput:
    """Images and the forward of plan's requests still in `live` (seq_ids of the engine's unfinished requests)."""
    out = RunnerOutput()
    runner.free_encoder_outputs(plan.free_encoder_keys)
    runner.update_batch(plan)  # new requests' sampling state, every request's table: the persistent batch

    def alive(reqs):  # still unfinished, and not failed in an earlier stage of this step
        dead = out.dead
        return [r for r in reqs if r.seq_id in live and r.seq_id not in dead]

    jobs, took = isolate(alive(plan.encodes), runner.encode_images, out.fail("vision encode")) \
        if plan.encodes else ([], [])
    out.encoded = {j.seq_id: t for j, t in zip(jobs, took)}
    out.lost = tuple({j.keys[i] for j in plan.encodes for i in j.todo if j.keys[i] not in runner.encoder_cache})
    reqs = alive(plan)
    if not reqs:
        return out
    run = lambda b: runner.forward(plan if len(b) == len(plan.requests) else plan.only(b))  # noqa: E731
    guard = all_or_none if runner.recurrent else isolate  # a recurrent state cannot run twice
    ran, logits = guard(reqs, run, out.fail("model run"))
    out.ran = {r.seq_id for r in ran}
    if ran:
        out.logits = (ran, logits if isinstance(logits, torch.Tensor) else torch.stack(logits))
    return out


def sample_tokens(runner, out: RunnerOutput, skip, masks):
    """Verify and sample for the requests whose forward ran, minus `skip` (failed since, or read unwritten K/V);
    masks: the step's grammar masks (engine/sampling/grammar_masks.py), waited for here, or None. Then the MTP
    head (if it drafts) guesses the next step's tokens: a failure there only costs the guesses."""
    ran = out.logits[0] if out.logits is not None else ()
    _verify_and_sample(runner, out, skip, masks)
    if getattr(runner, "proposer", None) is not None and ran:
        try:
            runner.proposer.propose(ran, out, set(skip) | out.dead)
        except Exception:  # noqa: BLE001 -- drafts are optional: decoding goes on without them
            log.exception("the MTP head failed; this step proposes no guesses")
            runner.proposer.guesses.clear()


def _verify_and_sample(runner, out: RunnerOutput, skip, masks):
    if out.logits is None:
        return
    ran, logits = out.logits
    out.logits = None  # the rows are not kept past the step
    row = dict(zip((r.seq_id for r in ran), itertools.accumulate([r.num_logits for r in ran], initial=0)))
    wanted = [r for r in ran if r.sample and r.seq_id not in skip]
    spec = [r for r in wanted if r.draft]  # speculating: its guesses verified on its k + 1 rows
    out.masks = masks.wait() if masks is not None else None
    if spec:
        kept, emitted = isolate(spec, lambda b: runner.verify_drafts(
            b, [logits[row[r.seq_id]:row[r.seq_id] + r.num_logits] for r in b],
            out.masks.checked(b) if out.masks is not None else None), out.fail("verification"))
        out.spec = {r.seq_id: e for r, e in zip(kept, emitted)}
        wanted = [r for r in wanted if not r.draft]
    if not wanted:
        return
    if len(wanted) < len(ran) or spec:
        logits = logits[torch.tensor([row[r.seq_id] for r in wanted], device=logits.device)]
        row = {r.seq_id: i for i, r in enumerate(wanted)}
    sampled, tokens = isolate(wanted, lambda b: runner.sample_tokens(
        b, logits if len(b) == len(wanted) else logits[[row[r.seq_id] for r in b]],
        out.masks.checked(b) if out.masks is not None else None), out.fail("sampling"))
    out.sampled = {r.seq_id: t for r, t in zip(sampled, tokens)}
