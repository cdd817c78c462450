"""Block-manager invariants under random allocate / append / share / free / preempt sequences (hypothesis)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivlm.engine.kv_cache.full_attention import FullAttentionManager
from minivlm.model.rope import mrope_positions
from minivlm.inputs.prompt import Prompt
from minivlm.engine.kv_cache.prefix_keys import extend_keys
from minivlm.engine.request import Request, SamplingParams
from minivlm.engine.sequence import Sequence

BS = 4


def make_seq(tokens: list[int]) -> Sequence:
    prompt = Prompt(tokens, [0] * len(tokens), None, [])
    pos, delta = mrope_positions(prompt.token_types, [], 2)
    seq = Sequence(Request(prompt="x"), prompt, SamplingParams(), pos, delta, None)
    extend_keys(seq, BS, "C", "m", "float32")
    return seq


def admit(bm: FullAttentionManager, seq: Sequence):
    """Allocate seq's blocks and publish them, as the scheduler does for a prefill computed in one step (the cached
    prefix it reports recorded as EngineCore.update records it)."""
    seq.cache_hits = bm.allocate(seq)
    seq.num_computed = seq.num_cached_tokens = len(seq.cache_hits) * BS
    bm.publish(seq, len(seq))


def check_invariants(bm: FullAttentionManager, live: list[Sequence]):
    owners = {}
    for s in live:
        for b in bm.table(s):
            owners[b] = owners.get(b, 0) + 1
    used = [b for b in bm.blocks if b.ref_count > 0]
    assert len(bm.free) + len(used) == len(bm.blocks)                      # free + used = total
    assert len(set(bm.free)) == len(bm.free)                               # nothing freed twice
    assert all(b.ref_count == owners.get(b.block_id, 0) for b in bm.blocks)  # ref counts = owners
    assert not (set(bm.free) & {b.block_id for b in used})
    for key, b in bm.key_to_block.items():                                  # the table points at live content
        assert bm.blocks[b].key == key


ops = st.lists(st.tuples(st.sampled_from(["alloc", "alloc_shared", "append", "free", "preempt"]),
                         st.integers(0, 10_000)), min_size=1, max_size=60)


def run_ops(num_blocks: int, program):
    bm = FullAttentionManager(num_blocks, BS, caching=True)
    live: list[Sequence] = []
    prefixes = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], [5, 4, 3, 2, 1]]
    for op, r in program:
        if op in ("alloc", "alloc_shared"):
            base = prefixes[r % 3] if op == "alloc_shared" else []
            seq = make_seq(base + [r % 50 + 10 + i for i in range(1 + r % 9)])
            if bm.can_allocate(seq):
                admit(bm, seq)
                live.append(seq)
        elif op == "append" and live:
            seq = live[r % len(live)]
            seq.num_computed = len(seq)
            seq.append_token(r % 97)
            if bm.can_append(seq):
                bm.append_slot(seq)
                if seq.num_computed % BS == 0:
                    extend_keys(seq, BS, "C", "m", "float32")
                    bm.register(seq, seq.num_computed // BS - 1)
            else:
                bm.deallocate(seq)
                live.remove(seq)
        elif op in ("free", "preempt") and live:
            seq = live.pop(r % len(live))
            bm.deallocate(seq)
            if op == "preempt" and bm.can_allocate(seq):  # recompute: re-admit at once
                admit(bm, seq)
                live.append(seq)
        check_invariants(bm, live)
    for seq in live:
        bm.deallocate(seq)
    check_invariants(bm, [])
    assert len(bm.free) == num_blocks                                         # all free at the end


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(1, 24), program=ops)
def test_block_manager_invariants(num_blocks, program):
    run_ops(num_blocks, program)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(1, 24), program=ops)
def test_block_manager_invariants_at_scale(num_blocks, program):
    run_ops(num_blocks, program)


def test_shared_prefix_is_shared_and_revivable():
    bm = FullAttentionManager(8, BS, caching=True)
    a, b = make_seq(list(range(10))), make_seq(list(range(10)))
    admit(bm, a)
    admit(bm, b)
    assert bm.table(a)[:2] == bm.table(b)[:2] and b.num_cached_tokens == 8
    assert bm.blocks[bm.table(a)[0]].ref_count == 2
    bm.deallocate(a), bm.deallocate(b)
    c = make_seq(list(range(10)))
    admit(bm, c)  # freed blocks keep their keys: revived, not recomputed
    assert c.num_cached_tokens == 8 and not any(h.false_hit for h in c.cache_hits)


def test_eviction_order_is_exact_tail_blocks_first_never_used_blocks_before_cached_ones():
    bm = FullAttentionManager(6, BS, caching=True)
    a = make_seq(list(range(10)))                      # 2 full blocks + 1 partial
    admit(bm, a)
    assert bm.table(a) == [0, 1, 2] and list(bm.free) == [3, 4, 5]
    assert set(bm.key_to_block.values()) == {0, 1}       # only full blocks are published
    bm.deallocate(a)
    assert list(bm.free) == [3, 4, 5, 2, 1, 0]           # a prefix's tail goes first, its head (most shared) last
    b = make_seq([100 + t for t in range(12)])
    admit(bm, b)
    assert bm.table(b) == [3, 4, 5] and set(bm.key_to_block.values()) == {0, 1, 3, 4, 5}
    c = make_seq([200 + t for t in range(8)])
    admit(bm, c)                                        # takes block 2 (never published), then evicts block 1
    assert bm.table(c) == [2, 1] and bm.blocks[0].key is not None and bm.key_to_block[bm.blocks[1].key] == 1
    d = make_seq(list(range(10)))
    assert bm.match_prefix(d) == [0]                      # a's head block survived, its second block did not


def test_a_block_published_in_the_same_step_is_a_hit():
    bm = FullAttentionManager(8, BS, caching=True)
    a, b = make_seq(list(range(9))), make_seq(list(range(9)))
    admit(bm, a)                                        # one scheduling pass: a, then b, before any forward
    admit(bm, b)
    assert bm.table(b)[:2] == bm.table(a)[:2] and b.num_computed == 8
    assert [(h.block_id, h.logical_index, h.false_hit) for h in b.cache_hits] == [(0, 0, False), (1, 1, False)]
    assert [bm.blocks[i].ref_count for i in range(4)] == [2, 2, 1, 1] and list(bm.free) == [4, 5, 6, 7]


def test_forget_after_a_failed_step_unpublishes_what_was_never_written():
    bm = FullAttentionManager(8, BS, caching=True)
    a, b = make_seq(list(range(9))), make_seq(list(range(9)))
    admit(bm, a)
    admit(bm, b)
    bm.forget(a)                                          # a's forward failed: its blocks hold no K/V
    assert bm.key_to_block == {} and all(bm.blocks[i].key is None for i in range(3))
    assert [bm.blocks[i].ref_count for i in range(4)] == [1, 1, 0, 1] and list(bm.free) == [4, 5, 6, 7, 2]
    c = make_seq(list(range(9)))
    assert bm.match_prefix(c) == []                       # nobody may reuse K/V that was never computed
    check_invariants(bm, [b])
