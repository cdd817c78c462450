"""The one interface every KV-cache group's manager answers (vLLM's SingleTypeKVCacheManager): the coordinator
(coordinator.py) makes each call for every group in turn. A default here is what a group with nothing of that kind
does (no blocks to cache, no state to save, nothing held for guesses), so each manager holds only what its kind of
state does: full_attention.py, sliding_window.py, recurrent.py, kv_shared.py. A new kind of layer state is one more
subclass."""
from abc import ABC, abstractmethod


class GroupManager(ABC):
    """One KV-cache group's blocks or state slots, and every request's share of them."""
    kind: str                 # the group's CacheSpec kind, as the KV events and the block map name it
    window: int | None = None  # the sliding window in tokens (None: the group keeps every token, or no tokens)
    rewinds = True            # it can go back to an earlier token (a recurrent state cannot: recomputed from zero)
    speculates = False        # it can hold guesses for a step and give back the rejected ones (reserve, trim)

    @classmethod
    @abstractmethod
    def make(cls, pool, group_idx: int, block_size: int, caching: bool, events) -> "GroupManager":
        """The manager of one group of a pool (kv_pool.GroupPool: its size, window or sources)."""

    # ---- admission ----
    def longest_hit(self, seq, n: int) -> int:
        """The most blocks <= n of the leading group's hit this group can serve for seq."""
        return n

    def admit(self, seq, n: int):
        """seq is admitted with an n-block hit: its table or slot here."""

    # ---- each step ----
    def begin_step(self):
        """A new plan starts: forget what the last one took."""

    def save_points(self, seq) -> list[int]:
        """Tokens after which this group saves seq's state (the scheduler ends a chunk at each)."""
        return []

    def advance(self, seq, start: int, end: int):
        """Before seq computes tokens [start, end): take what they need, give back what no query will see."""

    def publish(self, seq, end: int, start: int | None = None) -> list[tuple[int, str]]:
        """Cache the full blocks that computing seq's tokens [start, end) completes: (block id, key) of each."""
        return []

    def register(self, seq, i: int) -> list[tuple[int, str]]:
        """Cache seq's full block i (a decode just completed it): (block id, key) if newly published."""
        return []

    def ran(self, seq):
        """seq's step ran (its num_computed moved): what it saved becomes reusable."""

    @abstractmethod
    def step_part(self, seq, start: int, end: int):
        """seq's part of this step in this group, for the plan (a group_steps.py class)."""

    # ---- guesses (speculative decoding) ----
    def reserve(self, seq, num_tokens: int):
        """Room for seq's guesses up to token num_tokens."""

    def trim(self, seq) -> list[int]:
        """Give back what only rejected guesses held: the blocks freed."""
        return []

    # ---- leaving ----
    def deallocate(self, seq):
        """seq leaves (finished, preempted, aborted): free what it holds (cached content stays cached)."""

    def forget(self, seq, written: int | None = None):
        """seq failed: uncache what it never wrote (from token `written` on), then free what it holds."""
        self.deallocate(seq)

    def unpublish(self, seq, start: int):
        """Uncache what seq published from token `start` on (it read K/V nobody wrote), keeping it held."""

    def reset(self):
        """Forget everything cached that no request holds."""

    # ---- pictures ----
    @abstractmethod
    def info(self, layers: list[int], rid: dict[int, str]):
        """The group now, for the block map and the KV tab (a GroupInfo), with the tables of the requests in rid."""

    def wire(self) -> tuple[str, int | None]:
        """(kind, window) as the KV events name the group."""
        return self.kind, self.window
