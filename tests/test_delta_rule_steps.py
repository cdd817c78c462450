"""A Gated DeltaNet's verify (conv once over the step's tokens, the delta rule token by token in
model/delta_rule_steps.py) against the same tokens decoded one at a time through `advance` (transformers'
torch_recurrent_gated_delta_rule on one token): outputs, each kept state and the slot's final state bit for bit
equal, at the tiny model's shapes, the test checkpoints' and without grouped value heads, for 1 to 5 tokens."""
from types import SimpleNamespace

import pytest
import torch

from minivlm.model.qwen3_5 import GatedDeltaNet


def layer(seed: int, k_heads: int, v_heads: int, dim: int) -> GatedDeltaNet:
    cfg = SimpleNamespace(linear_num_key_heads=k_heads, linear_num_value_heads=v_heads, linear_key_head_dim=dim,
                          linear_value_head_dim=dim, linear_conv_kernel_dim=4, hidden_size=64, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    net = GatedDeltaNet(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return net


def states(net, slots: int = 3):
    conv, rule = net.state_shapes
    return torch.randn(slots, *conv), torch.randn(slots, *rule) * 0.3


@pytest.mark.parametrize("L", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("shapes", [(2, 4, 32), (2, 4, 16), (2, 2, 16)])  # tiny model, test checkpoints, ungrouped
@torch.inference_mode()
def test_verify_equals_decoding_token_by_token(L, shapes):
    for seed in range(10):
        net = layer(seed, *shapes)
        qkv, z, b, a = net.in_proj(torch.randn(L, 64)).split(net.splits, dim=-1)
        beta, g = b.sigmoid(), -net.A_log.exp() * torch.nn.functional.softplus(a + net.dt_bias)
        slot = torch.tensor([1])
        start = states(net)
        truth = tuple(s.clone() for s in start)
        want_out, want_kept = [], []
        for t in range(L):  # a decode per token: the engine's path without guesses
            want_out.append(net.advance(qkv[None, t:t + 1], g[None, t:t + 1], beta[None, t:t + 1], truth, slot)[0, 0])
            want_kept.append(tuple(s[1].clone() for s in truth))
        got = tuple(s.clone() for s in start)
        out = torch.empty(L, net.v_heads, net.v_dim)
        kept = net.verify(qkv, g, beta, got, slot, out)
        assert torch.equal(out, torch.stack(want_out))
        assert len(kept) == L - 1
        for (conv, rule), (want_conv, want_rule) in zip(kept, want_kept):
            assert torch.equal(conv, want_conv) and torch.equal(rule, want_rule)
        for s, want, before in zip(got, truth, start):
            assert torch.equal(s, want)
            assert torch.equal(s[[0, 2]], before[[0, 2]])  # the other slots untouched
