"""The sliding-window group's book under speculation (#55 item 2), by hand on a window smaller than the guesses reach:
guesses past the window's edge free no block the step's own token (or the next step, after a rejection) still reads;
blocks that held only rejected guesses go back; every count exact."""
from minivlm.engine.kv_cache.sliding_window import SlidingWindowManager


class Seq:
    """What the manager reads of a request: its id, length and computed tokens."""

    def __init__(self, n: int):
        self.seq_id, self.request_id, self.n, self.num_computed = 0, "r", n, n - 1
        self.block_keys, self.block_extras = [], []

    def __len__(self):
        return self.n


def test_guesses_past_the_window_free_nothing_the_accepted_tokens_read():
    bs, window = 2, 3
    m = SlidingWindowManager(window, 16, bs, False, None, group_idx=1)
    seq = Seq(10)  # decoding token 9: its query sees keys 7..9, blocks 3 and 4
    m.admit(seq, 0)
    m.advance(seq, 0, 9)  # its prefill: blocks 0-4
    assert m.num_free == 16 - 5
    m.begin_step()
    m.reserve(seq, 10 + 4)  # 4 guesses, positions 10..13: the last one sees keys 11..13 only
    table = m.table(seq)
    assert [b is None for b in table] == [True] * 3 + [False] * 4  # blocks 0-2 out of token 9's window, 3-6 held
    part = m.step_part(seq, 9, 14)
    assert len(part.slots) == 5 and part.dropped == (0, 1, 2)
    # verification accepts 1 guess: the request is 12 tokens long, its next step starts at token 11
    seq.n, seq.num_computed = 12, 11
    freed = m.trim(seq)
    assert len(freed) == 1 and len(m.table(seq)) == 6  # block 6 held only guesses 12 and 13
    assert m.num_free == 16 - 3  # blocks 3, 4, 5 held: token 11 reads keys 9..11 (blocks 4, 5), 9's block 4 too
    m.begin_step()
    m.advance(seq, 11, 12)  # the next step gives back block 3 only now, when no accepted position sees it
    assert [b is None for b in m.table(seq)] == [True] * 4 + [False] * 2 and m.num_free == 16 - 2
    m.deallocate(seq)
    assert m.num_free == 16 and not m.tables
