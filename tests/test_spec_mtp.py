"""MTP speculation (#55 item 1) on a random Qwen3.5 checkpoint with random mtp.* weights: greedy tokens and
logprobs equal decoding without speculation (whole and chunked prefill, n = 2, preemption on a small pool) while the
head proposes guesses (random weights: they are rejected); the head's first guess's logits equal a plain-torch
implementation of the formula over the checkpoint's own tensors (transformers has no MTP forward) on transformers'
own final hidden states; nothing outlives a request aborted mid-draft."""
import pytest
import torch
import torch.nn.functional as F

from minivlm import Engine, EngineConfig, Request, SamplingParams
from minivlm.config import SpeculativeConfig

MTP = {"method": "mtp", "num_speculative_tokens": 2}
PROMPTS = ["red red red red red blue red red red", "one two three one two three one two"]
MAX = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    return make_qwen3_5_checkpoint(str(tmp_path_factory.mktemp("spec_mtp") / "qwen3_5"), seed=3, mtp=True)


def engine(path, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype="float32", max_model_len=1024,
                               **{"num_blocks": 64, **kw}))


def params(n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=MAX, ignore_eos=True, logprobs=2, n=n)


@pytest.fixture(scope="module")
def reference(checkpoint):
    with engine(checkpoint) as e:
        assert e.core.runner.proposer is None and e.model.decoder.mtp is None  # loaded only to draft with
        return e.generate([Request(prompt=p) for p in PROMPTS], [params(), params(2)])


def check_same(outs, want):
    got = [(c.token_ids, c.logprobs) for o in outs for c in o.choices]
    ref = [(c.token_ids, c.logprobs) for o in want for c in o.choices]
    for (tokens, lps), (ref_tokens, ref_lps) in zip(got, ref, strict=True):
        assert tokens == ref_tokens and len(tokens) == MAX
        for t, a, b in zip(tokens, lps, ref_lps):
            assert abs(a[t] - b[t]) < 1e-4 and set(a) == set(b)


def check_nothing_held(e):
    for g in e.core.block_manager.managers:
        if g.kind == "recurrent":
            assert not g.slot_of and len(set(g.free) | set(g.checkpoints.values())) == g.num_slots
        else:
            assert all(b.ref_count == 0 for b in g.blocks) and g.num_free == len(g.blocks) and not g.tables
    p = e.core.runner.proposer
    assert not p.tokens and not p.guesses and p.step is None


def test_vllm_names_mean_mtp():
    for name in ("mtp", "qwen3_next_mtp", "qwen3_5_mtp"):
        assert SpeculativeConfig.parse({"method": name, "num_speculative_tokens": 2}).method == "mtp"
    with pytest.raises(ValueError, match="not supported"):
        SpeculativeConfig.parse({"method": "eagle3"})


def test_the_status_line_names_the_head_not_a_lookup():
    from panels.holder import speculation_part
    mtp, ngram = (SpeculativeConfig.parse({"method": m, "num_speculative_tokens": 2}) for m in ("mtp", "ngram"))
    assert "multi-token-prediction head" in speculation_part(mtp) and "lookup" not in speculation_part(mtp)
    assert "多 token 预测头" in speculation_part(mtp, "zh-CN") and "prompt lookup" in speculation_part(ngram)


def test_a_model_without_a_head_says_so(tmp_path):
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    path = make_qwen3_5_checkpoint(str(tmp_path / "plain"), seed=3)
    with pytest.raises(ValueError, match="multi-token-prediction head"):
        engine(path, speculative_config=MTP)


@pytest.mark.parametrize("settings", [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 8}],
                         ids=["whole", "chunked"])
def test_greedy_answers_equal_decoding_without_speculation(checkpoint, reference, settings):
    with engine(checkpoint, speculative_config=MTP, **settings) as e:
        assert len(e.core.runner.proposer.caches) == 1  # the head's layer has its K/V in the pool
        check_same(e.generate([Request(prompt=p) for p in PROMPTS], [params(), params(2)]), reference)
        s = e.spec_decode_stats()
        assert s.num_drafts > 0 and s.num_accepted_tokens < s.num_draft_tokens, s
        assert len(s.accepted_per_pos) == 2  # the head applied twice: two guesses a step
        check_nothing_held(e)
        said = [ev for ev in e.events() if ev.kind == "speculated"]
        assert said and all(ev.method == "mtp" and 1 <= len(ev.draft) <= 2 for ev in said)  # fewer near max_tokens
        from minivlm.views.events import describe
        from panels.i18n.events import describe_in
        assert describe(said[0]).startswith(f"{said[0].request_id}'s MTP head drafted {len(said[0].draft)} token(s) from ")
        assert describe_in(said[0], "en") == describe(said[0]) and "MTP 头" in describe_in(said[0], "zh-CN")


def test_preemption_changes_no_token(checkpoint, reference):
    with engine(checkpoint) as plain:
        longest = max(len(plain.make_sequence(Request(prompt=p), params())) for p in PROMPTS)
    with engine(checkpoint, speculative_config=MTP, num_blocks=-(-(longest + MAX) // 16) + 1) as e:
        check_same(e.generate([Request(prompt=p) for p in PROMPTS], [params(), params(2)]), reference)
        assert e.snapshot().num_preemptions > 0 and e.spec_decode_stats().num_drafts > 0
        check_nothing_held(e)


def test_aborted_mid_draft_leaks_nothing(checkpoint):
    with engine(checkpoint, speculative_config=MTP) as e:
        with e.submit(Request(prompt=PROMPTS[0]), params()) as handle:
            for _ in handle:
                if e.spec_decode_stats().num_drafts:
                    break  # leaving the handle aborts the request
        e.generate(Request(prompt="red"), SamplingParams(max_tokens=2))  # a step after the abort
        check_nothing_held(e)


def independent_guesses(path, tokens: list[int], k: int) -> list[torch.Tensor]:
    """The head's logits for guesses 1..k after `tokens`: transformers' final hidden states, then the formula in plain
    torch over the checkpoint's tensors, at positions [0, L-1); guess j + 1 runs it again with guess j's token and
    the head's own output at the last row appended (causal: the rows before are unchanged)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, Qwen3_5ForConditionalGeneration
    cfg = AutoConfig.from_pretrained(path).text_config
    hf = Qwen3_5ForConditionalGeneration.from_pretrained(path, torch_dtype=torch.float32).eval()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        hidden = hf.model.language_model(input_ids=ids).last_hidden_state[0]  # after the final norm
    w = {k[4:]: v.float() for k, v in load_file(f"{path}/model.safetensors").items() if k.startswith("mtp.")}
    emb, lm_head = hf.get_input_embeddings().weight.detach(), hf.lm_head.weight.detach()
    eps, H, d = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.head_dim
    kv = cfg.num_key_value_heads

    def norm(x, name):  # zero-centred RMSNorm
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w[name + ".weight"])

    def lin(x, name):
        return x @ w[name + ".weight"].T

    def head(nxt: torch.Tensor, hid: torch.Tensor) -> torch.Tensor:
        T = len(nxt)
        x = lin(torch.cat((norm(emb[nxt], "pre_fc_norm_embedding"), norm(hid, "pre_fc_norm_hidden")), -1), "fc")
        a = "layers.0.self_attn."
        h = norm(x, "layers.0.input_layernorm")
        q, gate = lin(h, a + "q_proj").view(T, H, 2 * d).chunk(2, dim=-1)
        k, v = lin(h, a + "k_proj").view(T, kv, d), lin(h, a + "v_proj").view(T, kv, d)
        q, k = norm(q, a + "q_norm"), norm(k, a + "k_norm")
        r = int(d * cfg.rope_parameters["partial_rotary_factor"])  # text: all three M-RoPE axes equal = plain RoPE
        inv = 1.0 / cfg.rope_parameters["rope_theta"] ** (torch.arange(0, r, 2).float() / r)
        ang = torch.arange(T).float()[:, None] * inv[None]
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1)[:, None], torch.cat((ang.sin(), ang.sin()), -1)[:, None]

        def rope(t):
            rot, rest = t[..., :r], t[..., r:]
            half = torch.cat((-rot[..., r // 2:], rot[..., :r // 2]), -1)
            return torch.cat((rot * cos + half * sin, rest), -1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // kv, 1), v.repeat_interleave(H // kv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, -1)
        x = x + lin(o * torch.sigmoid(gate.reshape(T, -1)), a + "o_proj")
        h = norm(x, "layers.0.post_attention_layernorm")
        x = x + lin(F.silu(lin(h, "layers.0.mlp.gate_proj")) * lin(h, "layers.0.mlp.up_proj"), "layers.0.mlp.down_proj")
        return norm(x, "norm")

    nxt, hid, out = ids[0, 1:], hidden[:-1], []
    for _ in range(k):
        h = head(nxt, hid)
        out.append(h[-1] @ lm_head.T)
        nxt, hid = torch.cat((nxt, out[-1].argmax()[None])), torch.cat((hid, h[-1:]))
    return out


def test_first_guess_logits_equal_the_formula(checkpoint, monkeypatch):
    from minivlm.engine.spec_decode.mtp import MtpProposer
    seen = []
    real = MtpProposer.propose

    def spy(self, ran, out, skip=frozenset()):
        real(self, ran, out, skip)
        seen.extend((list(self.tokens[s]), [x.clone() for x in lg]) for s, lg in self.logits.items())
        self.logits.clear()
    monkeypatch.setattr(MtpProposer, "propose", spy)
    with engine(checkpoint, speculative_config={"method": "mtp", "num_speculative_tokens": 3}) as e:
        e.generate(Request(prompt=PROMPTS[1]), SamplingParams(max_tokens=5, ignore_eos=True))
    tokens, logits = seen[1]  # after the first verify step: the head's K/V from a prefill and a verify
    want = independent_guesses(checkpoint, tokens, 3)
    assert len(logits) == 3
    for got, ref in zip(logits, want):  # the first guess, then the head on its own output twice
        assert torch.allclose(got, ref, atol=1e-4), (got - ref).abs().max()
    other = independent_guesses(checkpoint, tokens[:-1] + [tokens[-1] + 1], 1)[0]
    assert not torch.allclose(logits[0], other, atol=1e-4)  # the token just sampled matters


def test_after_accepted_guesses_the_head_drafts_from_the_last_accepted_row(checkpoint, reference, monkeypatch):
    """Oracle guesses (the plain answer's next tokens) are accepted, so each verify step keeps some; the head's next
    first guess must come from the row of the last accepted token (the formula on the tokens kept so far)."""
    from minivlm.engine.spec_decode.mtp import MtpProposer
    answer, seen = reference[0].choices[0].token_ids, []
    real_propose, real_draft = MtpProposer.propose, MtpProposer.draft

    def spy(self, ran, out, skip=frozenset()):
        real_propose(self, ran, out, skip)
        seen.extend((list(self.tokens[s]), lg[0].clone()) for s, lg in self.logits.items())

    monkeypatch.setattr(MtpProposer, "propose", spy)
    with engine(checkpoint, speculative_config=MTP) as e:
        prompt_len = len(e.make_sequence(Request(prompt=PROMPTS[0]), params()))

        def oracle_draft(self, seq_id, length):
            real_draft(self, seq_id, length)
            at = length - prompt_len
            return tuple(answer[at:at + 2]) if at < len(answer) else ()
        monkeypatch.setattr(MtpProposer, "draft", oracle_draft)
        check_same(e.generate([Request(prompt=PROMPTS[0])], [params()]), reference[:1])
        s = e.spec_decode_stats()
        assert s.num_accepted_tokens == s.num_draft_tokens > 0, s  # every oracle guess kept
    for tokens, logits in seen[1:3]:  # after verify steps that kept two guesses each
        want = independent_guesses(checkpoint, tokens, 1)[0]
        assert torch.allclose(logits, want, atol=1e-4), (logits - want).abs().max()


def test_a_prefix_cache_hit_reads_the_heads_cached_rows(checkpoint, monkeypatch):
    """The head's K/V are in group 0's blocks: a request that finds its prompt cached computes no head row for the
    cached tokens, and its first guess still equals the formula over the whole prompt."""
    from minivlm.engine.spec_decode.mtp import MtpProposer
    seen = []
    real = MtpProposer.propose

    def spy(self, ran, out, skip=frozenset()):
        real(self, ran, out, skip)
        seen.extend((list(self.tokens[s]), lg[0].clone()) for s, lg in self.logits.items())
        self.logits.clear()
    monkeypatch.setattr(MtpProposer, "propose", spy)
    prompt = " ".join(["one two three four five six seven"] * 6)
    with engine(checkpoint, speculative_config=MTP) as e:
        e.generate(Request(prompt=prompt), SamplingParams(max_tokens=1))
        seen.clear()
        out = e.generate(Request(prompt=prompt), SamplingParams(max_tokens=1))
    assert out.num_cached_tokens >= 16, out.num_cached_tokens  # at least one block of the prompt came from the cache
    tokens, logits = seen[0]
    want = independent_guesses(checkpoint, tokens, 1)[0]
    assert torch.allclose(logits, want, atol=1e-4), (logits - want).abs().max()
