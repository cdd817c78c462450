"""Executing one plan, exactly as written: free the encoder outputs it frees, encode its images, run the forward for
its requests, verify speculating requests' guesses, sample for those whose prefill completes, within their grammars'
masks (filled beside the forward where a core is free for it: engine/grammar_masks.py). A stage that raises is
retried one request at a time (plan.only: the same items, fewer of them); the requests that fail alone are failed.
Nothing here re-plans: a request whose forward read K/V that were never written (a block it hit lost its publisher
in this step) samples nothing, and EngineCore.update rewinds it."""
import itertools

import torch

from minivlm.engine.plan import StepOutcome, StepPlan
from minivlm.engine.step_result import StepResult, all_or_none, isolate


def execute(core, plan: StepPlan, res: StepResult) -> StepOutcome:
    """core: the EngineCore whose runner, scheduler, live requests, grammar masks and failure path the stage uses (a
    function of the core, not an object holding it: the core must be freed by reference counting alone)."""
    runner, out = core.runner, StepOutcome()
    runner.free_encoder_outputs(plan.free_encoder_keys)
    alive = lambda reqs: [r for r in reqs if r.seq_id in core.live]  # noqa: E731
    jobs, took = core._isolate("vision encode", alive(plan.encodes), runner.encode_images, res) \
        if plan.encodes else ([], [])
    out.encoded = {j.seq_id: t for j, t in zip(jobs, took)}
    out.lost = tuple({j.keys[i] for j in plan.encodes for i in j.todo} - set(runner.encoder_cache))
    reqs = alive(plan)
    if not reqs:
        return out
    masks = core.masks.start(r for r in reqs if r.sample)  # filling beside the forward, or left for sampling
    try:
        _run(core, plan, reqs, res, out, masks)
    finally:
        if masks is not None:
            masks.wait()  # a step never ends with a fill running: update advances these matchers
    return out


def _run(core, plan: StepPlan, reqs: list, res: StepResult, out: StepOutcome, masks):
    runner = core.runner
    run = lambda b: runner.forward(plan if len(b) == len(plan.requests) else plan.only(b))  # noqa: E731
    guard = all_or_none if runner.recurrent else isolate  # a recurrent state cannot run twice
    ran, logits = guard(reqs, run, core._seq, lambda seq, e: core.fail(seq, "model run", e, res))
    if not ran:
        return
    out.ran = {r.seq_id for r in ran}
    out.unwritten = core.scheduler.unwritten(ran, core.live) if res.failed else {}  # only a failure unpublishes
    logits = logits if isinstance(logits, torch.Tensor) else torch.stack(logits)
    row = dict(zip((r.seq_id for r in ran), itertools.accumulate([r.num_logits for r in ran], initial=0)))
    wanted = [r for r in ran if r.sample and r.seq_id not in out.unwritten]
    spec = [r for r in wanted if r.draft]  # speculating: its guesses verified on its k + 1 rows
    if spec:
        kept, emitted = core._isolate("verification", spec, lambda b: runner.verify_drafts(
            b, [logits[row[r.seq_id]:row[r.seq_id] + r.num_logits] for r in b]), res)
        out.spec = {r.seq_id: e for r, e in zip(kept, emitted)}
        wanted = [r for r in wanted if not r.draft]
    if not wanted:
        return
    if len(wanted) < len(ran) or spec:
        logits = logits[torch.tensor([row[r.seq_id] for r in wanted], device=logits.device)]
        row = {r.seq_id: i for i, r in enumerate(wanted)}
    out.masks = masks.wait() if masks is not None else None
    sampled, tokens = core._isolate("sampling", wanted, lambda b: runner.sample_tokens(
        b, logits if len(b) == len(wanted) else logits[[row[r.seq_id] for r in b]],
        out.masks.checked(b) if out.masks is not None else None), res)
    out.sampled = {r.seq_id: t for r, t in zip(sampled, tokens)}
