"""The gated delta rule over a few tokens of one sequence, token by token, keeping the state after each: what a
speculative verify step needs to roll back (model/qwen3_5.py's GatedDeltaNet.verify). Each token's arithmetic is
transformers' torch_recurrent_gated_delta_rule called on that token alone (a decode's), op for op on tensors of the
same shapes, so the outputs and states are bit for bit those of decoding the tokens one at a time
(tests/test_delta_rule_steps.py); only exact work (copies, transposes, the per-row l2 norms) is done for all tokens
at once, and none of the call's set-up is paid per token."""
import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' l2norm (FLA's), per row of the last axis."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_steps(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """q, k [L, k_heads, k_dim], v [L, v_heads, v_dim], g, beta [L, v_heads] (one sequence's L tokens), state
    [v_heads, k_dim, v_dim]. Returns the outputs [L, v_heads, v_dim] in v's dtype and the fp32 state after each token
    (the last one is the state after all L)."""
    dtype, repeat = v.dtype, v.shape[1] // k.shape[1]
    if repeat != 1:  # grouped value attention: each key head serves `repeat` consecutive value heads
        q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
    # token-major and dense, so that each token's [heads, dim] is laid out as a decode's (a reduction's order, so
    # its rounding, follows the layout); normed once: a row's norm does not see the others
    q, k, v = (x.to(torch.float32).contiguous() for x in (q, k, v))
    q, k = l2norm(q), l2norm(k)
    q = q / (q.shape[-1] ** 0.5)
    # each token's operands shaped for the rule's broadcasts, split once (views): no per-token indexing
    qs, ks, vs = q[..., None].unbind(0), k[..., None].unbind(0), v.unbind(0)
    decays = g.to(torch.float32).contiguous()[..., None, None].unbind(0)
    betas = beta.to(torch.float32).contiguous()[..., None].unbind(0)
    s, outs, states = state.to(torch.float32), [], []
    for q_t, k_t, v_t, decay_t, beta_t in zip(qs, ks, vs, decays, betas):
        s = s * decay_t.exp()  # exp per token: its few-wide call rounds as a decode's does
        delta = (v_t - (s * k_t).sum(dim=-2)) * beta_t
        s = s + k_t * delta.unsqueeze(-2)
        outs.append((s * q_t).sum(dim=-2))
        states.append(s)
    return torch.stack(outs).to(dtype), states
