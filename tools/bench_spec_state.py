"""How a hybrid model's recurrent state follows a verify step (#55): the measurement behind the engine's choice
(docs/ENGINE.md, "Speculation on hybrid models"). One Gated DeltaNet layer at Qwen3.5-0.8B's shapes (random weights),
B requests each verifying its last token and k guesses, with a random accepted count; per verify step:

  kept       the engine's way: the tokens one at a time (a decode's arithmetic), the state after each kept for the
             step, the one after the last accepted token copied back into the slot
  recompute  the state before the step copied aside, the tokens one at a time keeping only their layer inputs; after
             verification, a rejected guess restores the copy and runs the accepted tokens again
  chunk      the old path (prefill's chunked delta rule over all k + 1, no rollback: wrong after a rejection; not bit
             for bit a decode's arithmetic) for scale

    python tools/bench_spec_state.py [--k 4] [--batch 4] [--reps 20]"""
import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from minivlm.model.qwen3_5 import GatedDeltaNet

SHAPES = dict(hidden_size=1024, linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6)  # Qwen3.5-0.8B's


def inputs(layer, x):
    qkv, z, b, a = layer.in_proj(x).split(layer.splits, dim=-1)
    return qkv, b.sigmoid(), -layer.A_log.float().exp() * torch.nn.functional.softplus(a.float() + layer.dt_bias)


def kept(layer, x, state, slots, k, accepted):
    qkv, beta, g = inputs(layer, x)
    L = k + 1
    for i, slot in enumerate(slots):
        r = slice(i * L, (i + 1) * L)
        out = torch.empty(L, layer.v_heads, layer.v_dim)
        states = layer.verify(qkv[r], g[r], beta[r], state, torch.tensor([slot]), out)
        if accepted[i] < k:
            for t, s in zip(state, states[accepted[i]]):
                t[slot].copy_(s)


def recompute(layer, x, state, slots, k, accepted, backup):
    qkv, beta, g = inputs(layer, x)
    L = k + 1
    for i, slot in enumerate(slots):
        for t in state:
            t[backup + i].copy_(t[slot])
        r = slice(i * L, (i + 1) * L)
        for t in range(L):
            layer.advance(qkv[r][None, t:t + 1], g[r][None, t:t + 1], beta[r][None, t:t + 1], state,
                          torch.tensor([slot]))
    for i, slot in enumerate(slots):  # after verification: a rejected guess reruns the accepted tokens
        if accepted[i] < k:
            for t in state:
                t[slot].copy_(t[backup + i])
            r = slice(i * L, i * L + accepted[i] + 1)
            for t in range(accepted[i] + 1):
                layer.advance(qkv[r][None, t:t + 1], g[r][None, t:t + 1], beta[r][None, t:t + 1], state,
                              torch.tensor([slot]))


def chunk(layer, x, state, slots, k, accepted):
    qkv, beta, g = inputs(layer, x)
    L = k + 1
    for i, slot in enumerate(slots):
        r = slice(i * L, (i + 1) * L)
        layer.advance(qkv[None, r], g[None, r], beta[None, r], state, torch.tensor([slot]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layer = GatedDeltaNet(SimpleNamespace(**SHAPES)).eval()
    B, k = args.batch, args.k
    state = tuple(torch.zeros(2 * B, *s) for s in layer.state_shapes)  # B running slots + B for recompute's copies
    slot_bytes = sum(t[0].numel() * t.element_size() for t in state)
    x = torch.randn(B * (k + 1), SHAPES["hidden_size"])
    slots = list(range(B))
    ways = {"kept": lambda acc: kept(layer, x, state, slots, k, acc),
            "recompute": lambda acc: recompute(layer, x, state, slots, k, acc, B),
            "chunk": lambda acc: chunk(layer, x, state, slots, k, acc)}
    gen = torch.Generator().manual_seed(1)
    times = {name: [] for name in ways}
    with torch.inference_mode():
        for _ in range(args.reps):
            acc = torch.randint(0, k + 1, (B,), generator=gen).tolist()
            for name, run in ways.items():
                t = time.perf_counter()
                run(acc)
                times[name].append(time.perf_counter() - t)
    extra = {"kept": k * slot_bytes, "recompute": slot_bytes + (k + 1) * (layer.conv_dim + 2 * layer.v_heads) * 4,
             "chunk": 0}
    print(f"one Gated DeltaNet layer, Qwen3.5-0.8B shapes, {B} requests x (1 + {k}) tokens, CPU 1 thread, "
          f"median of {args.reps}")
    for name in ways:
        print(f"  {name:9s} {statistics.median(times[name]) * 1e3:7.2f} ms per verify step   "
              f"extra memory per request {extra[name] / 2**20:6.2f} MiB per layer")


if __name__ == "__main__":
    main()
