"""The grammar masks' fast paths (engine/sampling/structured_output.py) against llguidance's own: the CPU apply (numpy, one
pass) leaves logits exactly as llguidance's torch kernel does, and the step-through's counts and ids read the same
tokens as a bit-by-bit reading of the mask, for vocabularies that fill their last word and ones that do not."""
from types import SimpleNamespace

import llguidance.torch as lltorch
import pytest
import torch

from minivlm.engine.sampling.grammar_masks import BatchMasks
from minivlm.engine.sampling.structured_output import FEW, allowed_ids, apply_bitmasks, constrained_events


def random_masks(n: int, vocab: int, gen) -> list[torch.Tensor]:
    words = (vocab + 31) // 32
    masks = [torch.randint(-2**31, 2**31 - 1, (words,), dtype=torch.int32, generator=gen) for _ in range(n)]
    for m in masks:
        if vocab % 32:
            m[-1] &= (1 << vocab % 32) - 1  # llguidance sets no bit past the vocabulary
    return masks


@pytest.mark.parametrize("vocab, batch, rows", [(662, 8, range(8)), (662, 8, (1, 5)), (33, 2, (1,)),
                                                (151_936, 3, (0, 2))])
def test_the_cpu_apply_equals_llguidances_kernel(vocab, batch, rows):
    gen = torch.Generator().manual_seed(vocab + batch)
    masks = random_masks(len(rows), vocab, gen)
    logits = torch.randn(batch, vocab, generator=gen)
    full = torch.full((batch, masks[0].shape[0]), -1, dtype=torch.int32)
    full[list(rows)] = torch.stack(masks)
    truth = logits.clone()
    lltorch.apply_token_bitmask_inplace(truth, full)
    ours = logits.clone()
    apply_bitmasks(ours, list(rows), torch.stack(masks))
    assert torch.equal(ours, truth)
    assert torch.isinf(ours).any() and not torch.isinf(ours[[r for r in range(batch) if r not in rows]]).any()


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 662, 151_936])
def test_counts_and_ids_read_the_masks_bits(vocab):
    gen = torch.Generator().manual_seed(vocab)
    few = [torch.zeros((vocab + 31) // 32, dtype=torch.int32) for _ in range(3)]
    for i, m in enumerate(few):  # masks that allow a handful of tokens, as a grammar mostly does
        for t in torch.randint(0, vocab, (i * 5 + 1,), generator=gen).tolist():
            m[t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)
    masks = random_masks(4, vocab, gen) + few[:2] + [torch.zeros_like(few[0])] + few[2:]  # a row allowing nothing
    batch = BatchMasks(list(range(len(masks))),
                       [SimpleNamespace(vocab_size=vocab, words=masks[0].shape[0], consumed=0)] * len(masks))
    batch.bits.copy_(torch.stack(masks))
    lines = []  # the step-through's events for the batch, one per row
    sink = SimpleNamespace(emit=lambda kind, request_id, **fields: lines.append((request_id, fields)))
    constrained_events(sink, batch, {i: (0, None) for i in range(len(masks))},
                       {i: SimpleNamespace(request_id=i) for i in range(len(masks))}, str)
    for m, count, (i, line) in zip(masks, batch.counts().tolist(), lines):
        truth = [t for t in range(vocab) if (int(m[t // 32]) & 0xFFFFFFFF) >> (t % 32) & 1]
        assert allowed_ids(m, vocab).tolist() == truth
        assert count == len(truth) == line["allowed"] and line["vocab"] == vocab
        assert line["allowed_ids"] == (truth if count <= FEW else None)
