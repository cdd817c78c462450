"""Speculative decoding with n-gram prompt lookup (vLLM's `ngram` method). Decoding reads every weight once per
token; a cheap proposer guesses the next k tokens and one forward verifies them all, so each accepted guess is a
token for free. The proposer needs no model: it finds the request's last few tokens earlier in its own tokens
(prompt and answer) and proposes what followed there, which pays off where an answer copies (reading text back,
quoting the question). Verification (rejection_sampler.py) keeps the output exactly what decoding without speculation
gives, grammars, penalties and logit bias included."""
import logging
from dataclasses import dataclass, field

from minivlm.config import SpeculativeConfig
from minivlm.engine.spec_decode.rejection_sampler import verify  # noqa: F401 -- where callers found it first

log = logging.getLogger("minivlm")

NOT_ON_THIS_MODEL = "the model's {kind} KV-cache group cannot hold guessed tokens and give them back"


def propose(tokens: list[int], types: list[int], cfg: SpeculativeConfig, k: int) -> tuple[list[int], int]:
    """Up to k draft tokens for a sequence and where they were found: the longest suffix of n tokens (prompt_lookup_max
    down to prompt_lookup_min) seen earlier, its most recent earlier occurrence, and the tokens that followed it,
    stopping at an image or video placeholder (a guess is never a placeholder). A match close to the end reads on
    into its own guesses, so a repeating answer ("a b a b ...") is guessed k tokens ahead. ([], -1) when nothing
    matches."""
    n_tok = len(tokens)
    for n in range(min(cfg.prompt_lookup_max, n_tok - 1), cfg.prompt_lookup_min - 1, -1):
        suffix = tokens[n_tok - n:]
        if any(types[n_tok - n:]):
            continue
        for start in range(n_tok - n - 1, -1, -1):  # most recent earlier occurrence first
            if tokens[start:start + n] == suffix:
                follow = start + n
                draft = []
                while len(draft) < k and (follow >= n_tok or not types[follow]):
                    draft.append(tokens[follow] if follow < n_tok else draft[follow - n_tok])
                    follow += 1
                if draft:
                    return draft, start + n
    return [], -1


@dataclass
class SpecStats:
    """vLLM's spec_decode counters: drafts (speculating steps of a request), draft tokens, accepted tokens, and the
    accepted count per draft position."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int):
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_pos) < proposed:
            self.accepted_per_pos.append(0)
        for j in range(accepted):
            self.accepted_per_pos[j] += 1


class Speculator:
    """The scheduler's side: which decoding requests speculate this step, and their guesses with room for them. Any
    request may: a grammar, penalties or a logit bias shape each guess's logits as they would shape that token's
    (rejection_sampler.py). Not on a pool with a KV-cache group whose manager cannot hold guesses and give them back
    (its `speculates`; every group kind here can: a new kind that cannot is said once per request in a
    `not_speculated` event, once per kind in the log); and only as far as its max_tokens, max_model_len, the step's
    token budget and the free blocks allow."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int, events=None):
        self.config, self.max_model_len, self.events = config, max_model_len, events
        self.said: set[str] = set()   # reasons already logged
        self.proposer = None  # method "mtp": the runner's MtpProposer (engine/spec_decode/mtp.py), set by the core

    @staticmethod
    def why_not(bm) -> str | None:
        """The kind of this pool's first KV-cache group that cannot hold guesses and give them back (the coordinator's
        `speculates`, asked of each group's manager), or None."""
        if getattr(bm, "speculates", True):
            return None
        return next(g.kind for g in bm.managers if not getattr(g, "speculates", g.kind == "full_attention"))

    def most(self, seq, budget: int | None = None) -> int:
        """How many guesses seq may verify next: its max_tokens, max_model_len and the step's budget allowing."""
        if seq.num_output_tokens == 0 or seq.num_computed != len(seq) - 1:
            return 0
        return min(self.config.num_speculative_tokens, seq.params.max_tokens - seq.num_output_tokens - 1,
                   self.max_model_len - len(seq) - 1, budget - 1 if budget is not None else 1 << 30)

    def upcoming(self, seq) -> tuple[int, ...]:
        """The guesses seq's next step will verify, before the step's budget and free blocks cut them (`draft` takes
        a prefix of these): its grammar's masks along them fill ahead (engine/sampling/grammar_masks.py)."""
        k = self.most(seq)
        if k <= 0:
            return ()
        if self.config.method == "mtp":
            return self.proposer.peek(seq.seq_id, len(seq))[:k] if self.proposer is not None else ()
        return tuple(propose(seq.token_ids, seq.token_types, self.config, k)[0])

    def draft(self, seq, budget: int | None, bm, others: int = 0) -> tuple[tuple[int, ...], int]:
        if seq.num_output_tokens == 0 or seq.num_computed != len(seq) - 1:
            return (), -1
        if (reason := self.why_not(bm)) is not None:
            self.refuse(seq, reason)
            return (), -1
        k = self.most(seq, budget)
        if k <= 0:
            return (), -1
        if self.config.method == "mtp":  # the MTP head's guesses, made after the last step (none: no head)
            draft = list(self.proposer.draft(seq.seq_id, len(seq))[:k]) if self.proposer is not None else []
            at = len(seq) - 1  # drafted from the request's newest token
        else:
            draft, at = propose(seq.token_ids, seq.token_types, self.config, k)
        # slots it can hold without anyone being preempted for them: a free block stays for each running request's
        # next token
        spare = max(0, bm.num_free - others)
        room = (len(bm.table(seq)) + spare) * bm.block_size - len(seq)
        draft = draft[:max(0, room)]
        if draft:
            bm.reserve(seq, len(seq) + len(draft))
        return tuple(draft), at

    def refuse(self, seq, reason: str):
        """Say why seq does not speculate (reason: the group kind that cannot): a `not_speculated` event on its first
        decode step, a log line the first time a kind comes up."""
        if reason not in self.said:
            self.said.add(reason)
            log.warning("speculative decoding does not apply: %s", NOT_ON_THIS_MODEL.format(kind=reason))
        if seq.num_output_tokens == 1 and self.events is not None:  # its first decode step
            self.events.emit("not_speculated", seq.request_id, reason=reason)


class SpecRecorder:
    """The core's side: the counters (vLLM's spec_decode metrics) and one `speculated` event per speculating step of
    a request: what it guessed, where the guess was found, how many were accepted, which slots were given back."""

    def __init__(self, events, method: str = "ngram"):
        self.events, self.stats, self.method = events, SpecStats(), method  # method: who proposed the guesses

    def emit(self, seq, r, tokens: list, advance, bm) -> list:
        """Advance seq by the tokens its verified step emits (accepted guesses, then one more), each once the K/V
        before it exist (num_computed moves with it: guess j - 1 accepted means its K/V are the request's own);
        stop where the request finishes; then give back the blocks that held only rejected guesses."""
        events = []
        for j, (token, logprobs) in enumerate(tokens):
            seq.num_computed = r.end + j
            events.append(advance(seq, token, logprobs))
            if events[-1].finished:
                break  # a guess that ends the answer (EOS, a stop string, a complete grammar): nothing after counts
        self.record(seq, r, min(len(tokens) - 1, len(events)), bm.trim(seq), bm.rewinds)
        return events

    def record(self, seq, r, accepted: int, freed_blocks: list[int], rewinds: bool = True):
        """The counters and the event. rewinds: every group can go back to an earlier token (the coordinator's); a
        model with recurrent state cannot, so its slot kept the state after the last accepted token (the runner's
        RecurrentBuilder.accepted): `state_after` names that token (None: nothing to roll back on this model)."""
        accepted = min(accepted, len(r.draft))
        self.stats.record(len(r.draft), accepted)
        self.events.emit("speculated", seq.request_id, draft=list(r.draft), found_at=r.draft_at, method=self.method,
                         in_prompt=r.draft_at < seq.num_prompt_tokens, accepted=accepted,
                         given_back=list(r.slots[len(r.slots) - len(r.draft) + accepted:]), freed_blocks=freed_blocks,
                         state_after=None if rewinds else r.end - 1 + accepted)
