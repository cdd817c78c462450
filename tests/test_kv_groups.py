"""KV-cache groups' bookkeeping with exact block and slot ids: a sliding-window group gives blocks back as the window
moves and serves a prefix hit only when the window before it is cached; a recurrent group holds one slot per running
request and checkpoints its state at the prompt's save points (from the block boundary before its generation prompt to
its last one) and its latest decode boundary, so a follow-up turn that parts anywhere in the generation prompt resumes
at the last full block it shares, at every prompt length mod the block size; nothing leaks."""
from minivlm.engine.event_log import EventLog
from minivlm.engine.kv_cache.coordinator import build
from minivlm.engine.kv_cache.kv_pool import GroupPool
from tests.test_block_manager import BS, make_seq  # block size 4, strategy-C keys

WINDOW = 8  # a query sees itself and the 7 tokens before it


class Pool:
    """The sizes engine/kv_cache/kv_pool.py would give (no tensors: only the bookkeeping is under test)."""

    def __init__(self, full=16, sliding=None, slots=None):
        self.groups = {"full_attention": GroupPool("full_attention", [3], None, full, [])}
        if sliding:
            self.groups["sliding_window"] = GroupPool("sliding_window", [0, 1, 2], WINDOW, sliding, [])
        if slots:
            self.groups["recurrent"] = GroupPool("recurrent", [0, 1, 2], None, slots, [])


def cut(bm, seq, start: int, end: int) -> int:
    """The scheduler's rule (Scheduler._plan): a chunk ends at the first save point inside it."""
    return next((p for p in bm.save_points(seq) if start < p < end), end)


def run_chunks(bm, seq, chunks):
    """Admit seq and compute it chunk by chunk as the scheduler and update do: advance, publish, ran."""
    hits = bm.allocate(seq)
    start = len(hits) * BS
    seq.num_computed = start
    for size in chunks:
        end = cut(bm, seq, start, min(len(seq), start + size))
        bm.advance(seq, start, end)
        bm.publish(seq, end, start)
        seq.num_computed = end
        bm.ran(seq)
        start = end
    return hits


def test_sliding_blocks_leave_the_window_and_a_decode_holds_at_most_window_plus_two():
    bm = build(Pool(full=16, sliding=8), BS, True, EventLog(100))
    sw = bm.managers[1]
    seq = make_seq(list(range(100, 120)))  # 20 tokens: 5 blocks
    run_chunks(bm, seq, [8, 8, 4])
    # chunk 0-7 took sliding blocks 0,1; chunk 8-15 took 2,3 (its first query, at 8, still sees token 1);
    # chunk 16-19 sees from token 9 on: blocks of tokens 0-7 go back, and block 4 is taken
    assert sw.table(seq) == [None, None, 2, 3, 4]
    assert bm.table(seq) == [0, 1, 2, 3, 4]  # the full group keeps every block
    assert sorted(sw.free)[:2] == [0, 1] and sw.blocks[0].key is not None  # free, still cached by key
    for t in range(20, 40):  # decode: one token a step
        seq.token_ids.append(7)
        bm.advance(seq, t, t + 1)
        seq.num_computed = t + 1
        held = [b for b in sw.table(seq) if b is not None]
        assert len(held) <= -(-WINDOW // BS) + 2
    bm.deallocate(seq)
    assert sw.num_free == 8 and bm.num_free == 16  # nothing leaked


def test_a_sliding_prefix_hit_needs_the_window_before_it_cached():
    bm = build(Pool(full=16, sliding=8), BS, True, EventLog(100))
    first = make_seq(list(range(100, 120)))
    run_chunks(bm, first, [8, 8, 4])
    bm.deallocate(first)
    again = make_seq(list(range(100, 120)) + [5, 6, 7])
    # full group: blocks 0-4 cached; sliding: the window before token 20 (tokens 13-19: blocks 3, 4) is cached
    assert len(bm.match_prefix(again)) == 5
    hits = bm.allocate(again)
    assert [h.block_id for h in hits] == [0, 1, 2, 3, 4]
    assert bm.managers[1].table(again)[:3] == [None, None, None] and bm.managers[1].table(again)[3:] == [3, 4]
    bm.deallocate(again)
    # evict the sliding blocks of tokens 12-19 (a long request takes every free block): the hit must shrink to
    # where the window is still cached
    hog = make_seq(list(range(500, 532)))
    bm.allocate(hog)
    bm.advance(hog, 0, 32)
    third = make_seq(list(range(100, 120)) + [9])
    assert len(bm.match_prefix(third)) == 0


def test_recurrent_checkpoints_at_the_prompt_boundary_serve_the_next_turn():
    bm = build(Pool(full=32, slots=4), BS, True, EventLog(100))
    st = bm.managers[1]
    turn1 = make_seq(list(range(100, 118)))  # 18 tokens: the prompt's last boundary is at 16
    hits = bm.allocate(turn1)
    assert hits == [] and st.slot_of[turn1.seq_id] == 0
    end = cut(bm, turn1, 0, 18)
    assert end == 16  # the chunk is cut there so the state can be saved
    bm.advance(turn1, 0, end)
    assert bm.step_parts(turn1, 0, 16)[1].save_to == 1
    bm.publish(turn1, 16, 0)
    turn1.num_computed = 16
    bm.ran(turn1)
    assert dict(st.checkpoints) == {turn1.block_keys[3]: 1}
    bm.deallocate(turn1)
    assert sorted(st.free) == [0, 2, 3]  # its running slot back, the checkpoint kept
    turn2 = make_seq(list(range(100, 118)) + [1, 2, 3, 4, 5, 6])
    bm.begin_step()
    hits = bm.allocate(turn2)
    assert len(hits) == 4  # 16 of turn 1's 18 prompt tokens
    assert bm.step_parts(turn2, 16, 24)[1].restore_from == 1
    assert st.stats["checkpoint_hits"] == 1


def test_checkpoints_are_evicted_least_recently_used_and_slots_do_not_leak():
    bm = build(Pool(full=32, slots=3), BS, True, EventLog(100))
    st = bm.managers[1]
    prompts = [[200 + i] + list(range(100, 117)) for i in range(3)]  # 18 tokens each, saved at 16
    for p in prompts:
        bm.begin_step()
        s = make_seq(p)
        run_chunks(bm, s, [20, 20])
        bm.deallocate(s)
    # each request held a running slot while its checkpoint took another; three slots: the third prompt's save
    # evicted the first prompt's checkpoint
    keys = [make_seq(p).block_keys[3] for p in prompts]
    assert list(st.checkpoints) == keys[1:]
    for p in (prompts[0], prompts[2]):
        bm.begin_step()
        s = make_seq(p + [1])
        assert len(bm.allocate(s)) == (0 if p is prompts[0] else 4)  # evicted: recomputed; kept: resumed at 16
        bm.deallocate(s)
    assert len(st.free) + len(st.checkpoints) == 3 and not st.slot_of and not st.pending


def test_a_follow_up_that_parts_in_the_generation_prompt_resumes_at_every_shared_block():
    """Turn 2 keeps turn 1's prompt up to `keep` tokens before its end (Qwen3.5's history drops the `<think>` part of
    the generation prompt: the real template's generation prompt is 5 tokens with thinking on, `<|im_start|>`
    `assistant` `\\n` `<think>` `\\n`, of which turn 2 keeps all but 2; 7 with thinking off, all but 4). For every
    prompt length mod the block size, turn 2 hits every full block the two prompts share."""
    for tail, dropped in ((5, 2), (7, 4), (5, 5), (3, 1), (0, 1)):
        for n in range(9, 9 + 2 * BS):
            bm = build(Pool(full=64, slots=8), BS, True, EventLog(1000))
            turn1 = make_seq(list(range(100, 100 + n)))
            turn1.generation_tokens = tail
            bm.begin_step()
            run_chunks(bm, turn1, [64] * 3)  # the whole prompt asked for each step; the scheduler's rule cuts at save points
            bm.deallocate(turn1)
            shared = n - dropped
            turn2 = make_seq(list(range(100, 100 + shared)) + [7, 8, 9, 10, 11])
            bm.begin_step()
            hits = bm.allocate(turn2)
            assert len(hits) == shared // BS, (tail, dropped, n, len(hits))
            bm.deallocate(turn2)
            # the save points, and the prompt's end when it is a block boundary (a follow-up keeping it all resumes there)
            assert len(bm.managers[1].checkpoints) == len(bm.save_points(turn1)) + (n % BS == 0)
            assert len(bm.save_points(turn1)) <= 1 + -(-max(tail - 1, 0) // BS)  # two at most while tail <= BS + 1


def test_save_points_cost_one_checkpoint_or_two_and_the_chunks_end_there():
    bm = build(Pool(full=64, slots=8), BS, True, EventLog(100))
    seq = make_seq(list(range(100, 118)))  # 18 tokens: last boundary before the last token at 16
    seq.generation_tokens = 5  # the generation prompt is tokens 13-17: a follow-up keeps at least 13
    assert bm.save_points(seq) == [12, 16]
    seq.generation_tokens = 2  # tokens 16-17: one save point serves both
    assert bm.save_points(seq) == [16]
    seq.generation_tokens = 0  # no template known: the prompt's last boundary, as before
    assert bm.save_points(seq) == [16]
    seq.generation_tokens = 5
    ends = []
    bm.allocate(seq)
    start = 0
    while start < len(seq):
        end = cut(bm, seq, start, len(seq))
        bm.advance(seq, start, end)
        ends.append((end, bm.step_parts(seq, start, end)[1].save_to))
        bm.publish(seq, end, start)
        seq.num_computed = end
        bm.ran(seq)
        start = end
    assert ends == [(12, 1), (16, 2), (18, -1)]
    assert list(bm.managers[1].checkpoints.values()) == [1, 2]


def test_a_decoder_with_two_sliding_windows_is_refused_by_name():
    """Layers group by spec (kind and window); one pool per kind, so two windows are refused, naming them, not merged
    under the first layer's window (which would let the other layers read keys outside their own window)."""
    import pytest
    from minivlm.model.cache_spec import CacheSpec, group_layers
    full, short, long = (CacheSpec("full_attention", None, 2, 8), CacheSpec("sliding_window", 24, 2, 8),
                         CacheSpec("sliding_window", 48, 2, 8))
    assert group_layers([short, short, full, short]) == {"full_attention": [2], "sliding_window": [0, 1, 3]}
    with pytest.raises(ValueError, match=r"sliding_window layers with different windows \[24, 48\] \(layers \[0, 1, 3\]\)"):
        group_layers([short, long, full, short])


def test_a_decoder_without_full_attention_is_refused_by_name():
    """The full-attention group leads the coordinator (it offers every prefix hit, it backs the block map), so a
    decoder of sliding layers only is refused, naming its groups, instead of failing on a missing key."""
    import pytest
    from minivlm.engine.kv_cache.kv_pool import led_groups
    from minivlm.model.cache_spec import CacheSpec, group_layers
    full, short = CacheSpec("full_attention", None, 2, 8), CacheSpec("sliding_window", 24, 2, 8)
    assert led_groups(group_layers([short, full])) == {"full_attention": [1], "sliding_window": [0]}
    with pytest.raises(ValueError, match=r"no full-attention layer among sliding_window \(layers \[0, 1\]\)"):
        led_groups(group_layers([short, short]))


class PlainPool:
    """What engine/kv_cache/kv_pool.py gives a plain model: no groups, one pool of blocks for every layer."""
    groups: dict = {}

    def __init__(self, blocks: int, layers: int = 4):
        self.num_blocks, self.layer_caches = blocks, [None] * layers


def test_one_coordinator_drives_a_plain_a_sliding_and_a_recurrent_model_through_the_same_calls():
    """The same calls (allocate, advance, publish, ran, step_parts, deallocate) on a plain model (one group), a
    sliding one and a recurrent one: each computes a 20-token prompt in chunks, the same prompt again hits the cache
    as far as its groups can serve, and every group ends with nothing held."""
    runs = {}
    for name, pool in (("plain", PlainPool(16)), ("sliding", Pool(full=16, sliding=8)), ("recurrent", Pool(full=16, slots=4))):
        bm = build(pool, BS, True, EventLog(1000))
        first = make_seq(list(range(100, 120)))
        bm.begin_step()
        run_chunks(bm, first, [8, 8, 8])
        inputs = [type(part).__name__ for part in bm.step_parts(first, 19, 20)]
        bm.deallocate(first)
        again = make_seq(list(range(100, 120)) + [1])
        bm.begin_step()
        hits = bm.allocate(again)
        runs[name] = (bm.table(again)[:len(hits)], inputs, [g.kind for g in bm.groups([again])])
        bm.deallocate(again)
        assert bm.num_free == 16 and all(g.free + len(g.checkpoints) == g.size for g in bm.groups([]))
    assert runs["plain"] == ([0, 1, 2, 3, 4], ["AttentionGroupStep"], ["full_attention"])
    assert runs["sliding"] == ([0, 1, 2, 3, 4], ["AttentionGroupStep"] * 2, ["full_attention", "sliding_window"])
    # the recurrent group saved its state at 16 (the prompt's save point: no template) and at 20 (where the prompt
    # ends on a block boundary), so the same prompt and one more token resumes at 20, as far as the full group
    assert runs["recurrent"] == ([0, 1, 2, 3, 4], ["AttentionGroupStep", "StateGroupStep"],
                                 ["full_attention", "recurrent"])


def step_and_keep(bm, seq, kept, start, end, admitted=False):
    """One step of seq as the scheduler plans it and the runner keeps it: advance, each group's part (step_parts),
    each kept table changed by its part (AttentionGroupStep.apply, as engine/execution/input_batch.py does)."""
    bm.advance(seq, start, end)
    parts = bm.step_parts(seq, start, end)
    bm.publish(seq, end, start)
    seq.num_computed = end
    bm.ran(seq)
    for part, table in zip(parts, kept):
        part.apply(table, admitted)
    return parts


def test_each_groups_part_rebuilds_its_table_at_every_step():
    """The plan carries every group's table as a delta (the table at admission, blocks taken, indices given back out of
    the window): applied step after step, they give each manager's own table exactly (0 where a block left the
    window), chunked then decoded, for every prompt length mod the block size, a prefix hit's admission included."""
    for n in range(17, 17 + BS):
        bm = build(Pool(full=32, sliding=12), BS, True, EventLog(1000))
        for prompt in (list(range(100, 100 + n)), list(range(100, 100 + n)) + [1, 2]):  # the second hits the first
            seq, kept = make_seq(prompt), [[], []]
            bm.begin_step()
            start = len(bm.allocate(seq)) * BS
            admitted = True
            while start < len(seq):
                end = min(len(seq), start + 6)  # chunk edges cross block and window edges
                step_and_keep(bm, seq, kept, start, end, admitted)
                assert kept == [bm.table(seq), [b if b is not None else 0 for b in bm.managers[1].table(seq)]]
                start, admitted = end, False
                bm.begin_step()
            dropped = []
            for t in range(len(seq), len(seq) + 9):  # decode: one token a step, a block now and then
                seq.token_ids.append(7)
                bm.begin_step()
                bm.append_slot(seq)
                parts = step_and_keep(bm, seq, kept, t, t + 1)
                dropped += parts[1].dropped
                assert parts[0].slots == (bm.table(seq)[t // BS] * BS + t % BS,)
                assert kept == [bm.table(seq), [b if b is not None else 0 for b in bm.managers[1].table(seq)]]
            assert dropped and not parts[0].dropped  # the window moved while decoding; the full group keeps all
            bm.deallocate(seq)
        assert bm.num_free == 32 and bm.managers[1].num_free == 12
