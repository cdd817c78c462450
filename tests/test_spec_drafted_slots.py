"""The KV tab's block map on a speculating run (#55 item 5): each slot a rejected guess was written to is said to be
either given back with its block (the block held only rejected guesses) or left in a block the request keeps, to be
overwritten by its next tokens, in both languages; checked against the request's real block table after each step
(read from the engine's block manager, not from the events)."""
from minivlm import Engine, EngineConfig, Request, SamplingParams
from panels.plots import drafted_blocks

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
PROMPT = "Read this back: red circle, blue square, red circle, blue square, red circle."
BS = 4  # small blocks: guesses often cross into a block of their own


def test_rejected_slots_are_said_freed_or_overwritten_as_the_block_table_says():
    tables = {}
    with Engine(EngineConfig(device="cpu", dtype="float32", num_blocks=96, block_size=BS,
                             speculative_config=SPEC)) as e:
        full = e.core.block_manager.managers[0]

        def after(core):
            for seq_id in core._step_seqs:
                tables[core.step_count] = set(full.tables.get(seq_id, ()))
        e.core.after_step = after
        e.generate(Request(prompt=PROMPT), SamplingParams(max_tokens=40, ignore_eos=True))
        events = e.events()
    seen = {"map.draft_freed": 0, "map.draft_overwritten": 0}
    for verdict in (ev for ev in events if ev.kind == "speculated" and ev.accepted < len(ev.draft)):
        plan = next(ev for ev in events if ev.kind == "scheduled" and ev.step == verdict.step).plan
        slots = next(r["draft_slots"] for r in plan if r["request_id"] == verdict.request_id)
        en, zh = drafted_blocks(events, verdict.step, BS), drafted_blocks(events, verdict.step, BS, "zh-CN")
        for slot in slots[verdict.accepted:]:  # the rejected guesses' slots
            block, kept = slot // BS, slot // BS in tables[verdict.step]
            if kept:
                line = f"slot {slot}: {verdict.request_id}'s guess, rejected: left in block {block}, which " \
                       f"{verdict.request_id} keeps; its next tokens overwrite it"
                assert line in en[block].split("<br>") and f"留在 {verdict.request_id} 保留的块 {block} 中" in zh[block]
            else:
                line = f"slot {slot}: {verdict.request_id}'s guess, rejected: block {block} given back (it held " \
                       f"only rejected guesses)"
                assert line in en[block].split("<br>") and f"块 {block} 已归还" in zh[block]
            seen["map.draft_overwritten" if kept else "map.draft_freed"] += 1
    assert all(seen.values()), seen  # both cases came up
