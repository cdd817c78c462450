"""Each KV-cache group's part of one request's step, as plain data (vLLM's per-group block ids): its manager makes
it (engine/kv_cache/coordinator.py), the plan carries one per group (ScheduledRequest.groups, indexed by group id),
the runner's batch keeps what it changes (engine/execution/input_batch.py) and the group's metadata builder reads it
(engine/execution/group_metadata.py). A new kind of group brings its own part class here."""
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionGroupStep:
    """An attention group's part of one request's step (vLLM's per-group block ids), made by the group's manager: how
    its table changes (the runner keeps the table: engine/execution/input_batch.py) and where each token's K/V go."""
    num_blocks: int                       # the table's length after this step (guesses given back since the last
                                          # step shortened it)
    new_blocks: tuple[int, ...] = ()      # blocks taken in this step: appended to the table
    shared: tuple[int, ...] = ()          # admitted: the table it starts from (its prefix hits; 0 out of the window)
    dropped: tuple[int, ...] = ()         # table indices out of the window since this step (given back, or at
                                          # admission never held): 0 from now on
    slots: tuple[int, ...] = ()           # flat KV slot of each token it computes (its draft's too)

    def apply(self, table: list[int], admitted: bool) -> list[int]:
        """The kept table after this step (changed in place: a step costs its delta, not the table)."""
        if admitted:
            table[:] = self.shared
        del table[self.num_blocks - len(self.new_blocks):]
        table.extend(self.new_blocks)
        for i in self.dropped:
            table[i] = 0  # never read: the window's mask stops before it
        return table

    def to_dict(self, admitted: bool) -> dict:
        """The `scheduled` event's replay of this group (slots left out: one per token)."""
        out = {"num_blocks": self.num_blocks, "new_blocks": list(self.new_blocks), "dropped": list(self.dropped)}
        return {**out, "shared": list(self.shared)} if admitted else out


@dataclass(frozen=True)
class StateGroupStep:
    """A recurrent group's part of one request's step, made by its manager: the state slot it reads and updates, the
    checkpoint slot copied into it before the forward (a prefix hit), the slot it is copied into after (a save), and
    the guesses it verifies (speculative decoding): its layers keep the state after each of its tokens, and once
    verification says how many were accepted, the state after the last accepted one goes back into the slot."""
    slot: int
    restore_from: int = -1
    save_to: int = -1
    draft: int = 0

    def apply(self, table: list[int], admitted: bool) -> list[int]:
        """Nothing is kept across steps: every plan names the slot."""
        return table

    def to_dict(self, admitted: bool) -> dict:
        out = {"slot": self.slot, "restore_from": self.restore_from, "save_to": self.save_to}
        return {**out, "draft": self.draft} if self.draft else out


@dataclass(frozen=True)
class SharedGroupStep:
    """A kv_shared group's part of one request's step (Gemma 4's layers that read another layer's K/V): nothing of
    its own, only the groups whose blocks its layers read this step (kv_cache/kv_shared.py)."""
    reads: tuple[int, ...] = ()

    def apply(self, table: list[int], admitted: bool) -> list[int]:
        """No table of its own: it stays empty."""
        return table

    def to_dict(self, admitted: bool) -> dict:
        return {"reads": list(self.reads)}
