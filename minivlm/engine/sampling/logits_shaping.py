"""What a request's SamplingParams do to its logits before a token is chosen, for the whole batch at once: OpenAI's
logit_bias, presence and frequency penalties (over the answer's tokens), vLLM's repetition_penalty (over prompt and
answer), then the grammar's mask (structured outputs: disallowed tokens to -inf, last, so nothing can undo it)."""
import torch


def shape_logits(logits: torch.Tensor, reqs, masks=None) -> torch.Tensor:
    """logits [B, vocab] (fp32, a copy the caller may change), reqs: the plan's sampling requests in row order
    (their .seq_id, .params, .history, .num_prompt); masks: the step's grammar masks (grammar_masks.BatchMasks, filled)
    or None. Rows that ask for nothing are left as they are."""
    vocab = logits.shape[-1]
    for i, r in enumerate(reqs):
        p = r.params
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=logits.device)
            logits[i, ids] += torch.tensor(list(p.logit_bias.values()), device=logits.device)
        if r.history:
            penalize(logits[i], torch.tensor(r.history, device=logits.device), r.num_prompt, p, vocab)
    masked = [i for i, r in enumerate(reqs) if masks is not None and r.seq_id in masks.row]
    if masked:
        from minivlm.engine.sampling.structured_output import apply_bitmasks
        at = [masks.row[reqs[i].seq_id] for i in masked]
        apply_bitmasks(logits, masked, masks.bits if at == list(range(masks.bits.shape[0])) else masks.bits[at])
    return logits


def shape_draft_rows(rows: torch.Tensor, state, draft, masks=None) -> torch.Tensor:
    """A speculating request's k + 1 rows (fp32, a copy the caller may change), in place: row j shaped as the token
    after its first j guesses would be if they were accepted: the same logit bias, its penalties counting its history
    and those j guesses, its grammar's mask after them (masks.rows: its rows, walked along the draft). state: its
    persistent-batch row (.seq_id, .params, .history, .num_prompt)."""
    p, vocab = state.params, rows.shape[-1]
    if p.logit_bias:
        rows[:, torch.tensor(list(p.logit_bias), device=rows.device)] += torch.tensor(
            list(p.logit_bias.values()), device=rows.device)
    if state.history:
        penalize_along(rows, torch.tensor(state.history, device=rows.device), draft, state.num_prompt, p)
    if masks is not None and state.seq_id in masks.rows:
        from minivlm.engine.sampling.structured_output import apply_bitmasks
        first, n = masks.rows[state.seq_id]
        apply_bitmasks(rows, list(range(n)), masks.bits[first:first + n])
    return rows


def penalize(row: torch.Tensor, history: torch.Tensor, num_prompt: int, p, vocab: int):
    """One row, in place: repetition (vLLM: every token seen in prompt or answer, positive logits divided, negative
    multiplied), then frequency (times its count in the answer) and presence (once if in the answer) subtracted."""
    if p.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        seen[history] = True
        row[seen] = torch.where(row[seen] > 0, row[seen] / p.repetition_penalty, row[seen] * p.repetition_penalty)
    if p.frequency_penalty or p.presence_penalty:
        counts = torch.bincount(history[num_prompt:], minlength=vocab)[:vocab].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def penalize_along(rows: torch.Tensor, history: torch.Tensor, draft, num_prompt: int, p):
    """penalize() for every row of a speculating request at once, in place: row j counts history and the first j
    guesses (a count matrix built by a cumulative sum of the guesses, where a penalize() call per row cost ~0.5 ms each
    on a busy 2-core machine). The same float operations as penalize(), so a row comes out bitwise the same."""
    n, vocab = rows.shape
    guessed = torch.zeros(n, vocab, dtype=rows.dtype, device=rows.device)
    if len(draft):  # guess i counts from row i + 1 on
        guessed[torch.arange(1, 1 + len(draft), device=rows.device),
                torch.tensor(list(draft), device=rows.device)] = 1
    guessed = guessed.cumsum(0)
    if p.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=rows.device)
        seen[history] = True
        seen = seen | (guessed > 0)
        rows.copy_(torch.where(seen, torch.where(rows > 0, rows / p.repetition_penalty,
                                                  rows * p.repetition_penalty), rows))
    if p.frequency_penalty or p.presence_penalty:
        counts = torch.bincount(history[num_prompt:], minlength=vocab)[:vocab].to(rows.dtype) + guessed
        rows -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(rows.dtype)
