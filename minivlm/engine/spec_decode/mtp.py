"""Speculative decoding with the model's own multi-token-prediction head (vLLM's `mtp` method; Qwen3.5's `mtp.*`).
After each step's verification and sampling, the head runs over the step's rows with the main forward's metadata
(same positions and slots: its one layer's K/V live in KV-cache group 0 beside the decoder's, so they are sized,
allocated, freed and prefix-cached with them): row p reads the final hidden state at p and the embedding of the token
at p + 1, now known (the next prompt token, an accepted guess, or the token just sampled). The row of the request's
newest token gives the first guess; the head applied again on its own output and guess gives the next ones (dense,
past the paged context: those positions have no blocks yet). The next step's plan carries the guesses, verified as
n-gram's are; a rejected guess only leaves head K/V past the request's length, overwritten by its next tokens."""
import logging

import torch

from minivlm.model.attention import gather_kv

log = logging.getLogger("minivlm")


class MtpProposer:
    """The runner's side: each request's known tokens (for the token after a prefill chunk), and its guesses, kept
    with the length they continue until the scheduler asks (`draft`)."""

    def __init__(self, decoder, k: int, kv_caches: list, block_size: int, table_of):
        self.decoder, self.mtp, self.k, self.block_size = decoder, decoder.mtp, k, block_size
        self.table_of = table_of  # seq_id -> its group-0 block table (the runner's persistent batch)
        self.caches = kv_caches[len(decoder.layers):]  # the head's layers' (K, V), in group 0's pool
        self.tokens: dict[int, list[int]] = {}
        self.guesses: dict[int, tuple[int, tuple[int, ...]]] = {}  # seq_id -> (its length then, guesses)
        self.logits: dict[int, list[torch.Tensor]] = {}  # seq_id -> each guess's logits, last step (read by tests)
        self.step = None  # the last forward's (embeds, positions, metadata), kept until propose

    def add(self, seq_id: int, prompt_token_ids):
        self.tokens[seq_id] = list(prompt_token_ids)

    def remove(self, seq_id: int):
        for d in (self.tokens, self.guesses, self.logits):
            d.pop(seq_id, None)

    def draft(self, seq_id: int, length: int) -> tuple[int, ...]:
        """The guesses made for seq_id at this length (nothing if it changed since: preempted, or not yet run)."""
        at, guesses = self.guesses.pop(seq_id, (-1, ()))
        return guesses if at == length else ()

    def peek(self, seq_id: int, length: int) -> tuple[int, ...]:
        """The guesses `draft` would give, left in place (for the grammar masks filled ahead along them)."""
        at, guesses = self.guesses.get(seq_id, (-1, ()))
        return guesses if at == length else ()

    def known(self, r, emitted: list[int]) -> list[int]:
        """seq's tokens after this step: its rows' own tokens, then the ones it emitted."""
        toks = self.tokens.setdefault(r.seq_id, [])
        toks.extend([0] * (r.start - len(toks)))  # never read: only tokens after the step's first row are
        own = list(r.token_ids[:r.end - r.start])
        del toks[r.start:r.start + len(own)]
        toks[r.start:r.start] = own
        if emitted:
            del toks[r.end:]
            toks.extend(emitted)
        return toks

    @torch.inference_mode()
    def propose(self, ran, out, skip=frozenset()):
        """Run the head over the step's rows and keep each sampling request's guesses. ran: the requests of the
        forward, in its row order; out: the step's RunnerOutput (its `spec` and `sampled` tokens)."""
        if self.step is None or self.decoder.hidden is None:
            return
        embeds, positions, meta = self.step
        (cos, sin), hidden = self.decoder.rope, self.decoder.hidden
        self.step = self.decoder.hidden = self.decoder.rope = None
        spec, sampled = out.spec or {}, out.sampled or {}
        next_ids, reuse, wanted, row = [], [], [], 0
        for r in ran:
            emitted = [t for t, _ in spec[r.seq_id]] if r.seq_id in spec else \
                [sampled[r.seq_id][0]] if r.seq_id in sampled else []
            toks = self.known(r, emitted) if r.seq_id not in skip else []
            n = r.num_tokens
            for j in range(n):  # row j is position start + j: the token after it, where known
                p = r.start + j + 1
                t = toks[p] if p < len(toks) else (r.token_ids[j + 1] if j + 1 < n else 0)
                next_ids.append(t)
                reuse.append(j + 1 < n and r.token_ids[j + 1] == t)  # the step's embedding row (an image's too)
            if emitted and r.seq_id not in skip:
                wanted.append((r.seq_id, row + r.end - r.start - 1 + len(emitted) - 1, len(toks)))
            row += n
        ids = torch.tensor(next_ids, device=embeds.device)
        nxt = self.decoder.embed_tokens(ids)
        at = torch.tensor(reuse, device=embeds.device)
        shifted = torch.cat((embeds[1:], embeds[:1]))
        nxt = torch.where(at[:, None], shifted.to(nxt.dtype), nxt)
        h = self.mtp(nxt, hidden, cos, sin, self.caches, meta)  # the rows at the forward's own positions
        if not wanted:
            return
        rows = torch.tensor([w[1] for w in wanted], device=h.device)
        logits = self.decoder.compute_logits(h[rows])
        first = logits.argmax(-1).tolist()
        for (seq_id, r_i, length), tok, lg in zip(wanted, first, logits):
            self.logits[seq_id] = [lg]
            guesses = [tok] + self.further(seq_id, h[r_i:r_i + 1], tok, positions[:, r_i], length)
            self.guesses[seq_id] = (length, tuple(guesses))

    def further(self, seq_id: int, h, tok: int, pos, length: int) -> list[int]:
        """Guesses 2..k: the head on its own output and its last guess, one position on each time, attending over
        its paged K/V of positions [0, length - 1) and the rows before it (dense)."""
        if self.k < 2:
            return []
        table = torch.tensor(self.table_of(seq_id), device=h.device)
        past = [[gather_kv(k, table, length - 1), gather_kv(v, table, length - 1)]  # positions with head K/V
                for k, v in self.caches]
        ahead = pos[:, None] + torch.arange(1, self.k, device=h.device)  # text positions: every axis moves on
        cos, sin = self.decoder.rotary(ahead, h.dtype)
        out = []
        for j in range(self.k - 1):
            e = self.decoder.embed_tokens(torch.tensor([tok], device=h.device))
            h = self.mtp.dense_step(e, h, cos[j:j + 1, None], sin[j:j + 1, None], past)
            lg = self.decoder.compute_logits(h)[0]
            self.logits[seq_id].append(lg)
            tok = int(lg.argmax(-1))
            out.append(tok)
        return out
