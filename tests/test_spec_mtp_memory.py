"""The MTP head's memory (#55): as in vLLM, Qwen3.5's multi-token-prediction head is loaded and keeps K/V only when
speculation drafts with it (method "mtp"); with speculation off or n-gram it has no weights and no blocks. Checked on
the engine's real allocations (its pool's tensors, its weights) against the checkpoint's own mtp.* tensors; and the
calculator (minivlm.budget.estimate with speculative_config) counts the head's weights and K/V exactly as the engine
allocates them, on the tiny random Qwen3.5 checkpoint with an MTP head."""
import pytest
from safetensors.torch import load_file

from minivlm import Engine, EngineConfig
from minivlm.budget import estimate, hf_config, layer_groups
from minivlm.budget.kv_groups import groups_from_specs
from minivlm.model.cache_spec import engine_specs

MTP = {"method": "mtp", "num_speculative_tokens": 2}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2}
SETTINGS = dict(block_size=4, max_num_seqs=3, max_model_len=256, enable_chunked_prefill=True,
                max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
    return make_qwen3_5_checkpoint(str(tmp_path_factory.mktemp("mtp_memory") / "qwen3_5"), seed=3, mtp=True)


def engine(path, spec, **kw) -> Engine:
    return Engine(EngineConfig(model=path, device="cpu", dtype="float32", speculative_config=spec, **SETTINGS, **kw))


def saved_mtp_bytes(path) -> int:
    """The checkpoint's own mtp.* tensors, as float32 bytes."""
    return sum(t.numel() * 4 for k, t in load_file(f"{path}/model.safetensors").items() if k.startswith("mtp."))


def full_group(report) -> dict:
    return next(g for g in report.groups if g["kind"] == "full_attention")


@pytest.fixture(scope="module")
def allocations(checkpoint):
    """Per setting: the memory report, the full group's pool tensor shape, whether the head is there, the decoder's
    layers, the groups of what the engine keeps caches for."""
    out = {}
    for name, spec in (("off", None), ("ngram", NGRAM), ("mtp", MTP)):
        with engine(checkpoint, spec, num_blocks=40) as e:
            out[name] = (e.memory_report(), tuple(e.core.pool.groups["full_attention"].tensors[0].shape),
                         e.model.decoder.mtp is not None, len(e.model.decoder.layers),
                         groups_from_specs(engine_specs(e.model.decoder, e.config.speculative_config)))
    return out


def test_the_head_has_weights_and_blocks_only_when_it_drafts(checkpoint, allocations):
    cfg = hf_config(checkpoint).text_config
    head = saved_mtp_bytes(checkpoint)
    assert head > 0 and cfg.mtp_num_hidden_layers == 1
    off, ngram, mtp = allocations["off"], allocations["ngram"], allocations["mtp"]
    layers = off[3]
    for plain in (off, ngram):
        assert not plain[2]
        assert full_group(plain[0])["layers"] == [3]  # the decoder's one full-attention layer, no head layer
        assert plain[1][:3] == (2, 1, 40)  # K and V, one layer, 40 blocks
    assert mtp[2] and full_group(mtp[0])["layers"] == [3, layers] and mtp[1][:3] == (2, 2, 40)
    # the head's weights: exactly the checkpoint's mtp.* tensors, and nothing of them without it
    assert off[0].weights_bytes == ngram[0].weights_bytes == mtp[0].weights_bytes - head
    # its K/V: one more layer's K and V per token in every one of the full group's 40 blocks of 4 tokens
    per_token = 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    assert mtp[0].kv_cache_bytes - off[0].kv_cache_bytes == 40 * 4 * per_token
    assert full_group(mtp[0])["bytes"] == 2 * full_group(off[0])["bytes"]
    assert off[0].kv_cache_bytes == ngram[0].kv_cache_bytes
    # the calculator's groups: the engine's, with and without the head
    assert off[4] == ngram[4] == layer_groups(checkpoint) and mtp[4] == layer_groups(checkpoint, mtp=True)


def test_an_isolated_engine_cannot_add_a_head_its_model_was_loaded_without(checkpoint):
    with engine(checkpoint, None, num_blocks=8) as e:
        assert e.model.decoder.mtp is None and e.core.runner.proposer is None
        with pytest.raises(ValueError, match="loaded with that method"):
            e.isolated(speculative_config=MTP)


def test_an_isolated_engine_without_speculation_allocates_no_head_blocks(checkpoint):
    """The model keeps the head it was loaded with; an isolated engine that does not speculate gives it no K/V."""
    with engine(checkpoint, MTP, num_blocks=8) as e, e.isolated(speculative_config=None) as plain:
        assert full_group(e.memory_report())["layers"] == [3, 4]
        assert full_group(plain.memory_report())["layers"] == [3]
        assert plain.core.runner.proposer is None and len(plain.core.pool.layer_caches) == 4


def plan(path, budget, weights, spec):
    return estimate(hf_config(path), dtype="float32", kv_dtype="float32", max_model_len=256, num_seqs=3,
                    max_num_batched_tokens=16, block_size=4, gpu_memory_utilization=1.0, device_memory_bytes=budget,
                    weights_bytes=weights, enable_chunked_prefill=True, speculative_config=spec)


def test_the_calculator_counts_the_heads_weights_and_kv(checkpoint, allocations):
    """Predicted weights equal the engine's real ones with and without the head, and the head's KV is one more
    full-attention layer in the full group's bytes per token (hand-computed from the config)."""
    cfg = hf_config(checkpoint)
    plain, mtp = plan(checkpoint, 2 ** 30, None, NGRAM), plan(checkpoint, 2 ** 30, None, MTP)
    assert plain.predicted_weights_bytes == allocations["off"][0].weights_bytes
    assert mtp.predicted_weights_bytes == allocations["mtp"][0].weights_bytes
    assert "MTP head" in mtp.breakdown[0].formula and "MTP head" not in plain.breakdown[0].formula
    t = cfg.text_config
    assert mtp.kv_bytes_per_token == 2 * plain.kv_bytes_per_token == 2 * (2 * t.num_key_value_heads * t.head_dim * 4)
    assert "MTP head" in next(b.formula for b in mtp.breakdown if b.name == "KV cache: full-attention layers")
    assert plan(checkpoint, 2 ** 30, None, {"method": "qwen3_5_mtp"}).kv_bytes_per_token == \
        mtp.kv_bytes_per_token  # vLLM's family name means the same
    no_head = cfg.to_dict()  # a config without a head: refused by the calculator, as the engine refuses it
    no_head["text_config"].pop("mtp_num_hidden_layers", None)
    with pytest.raises(ValueError, match="multi-token-prediction head"):
        estimate(no_head, dtype="float32", device_memory_bytes=2 ** 30, speculative_config=MTP)


def test_the_calculator_equals_the_engines_real_allocation_with_the_head(checkpoint):
    """num_blocks=None: the engine sizes its pools from its memory budget with the head's K/V in the full group, and
    estimate() with the same budget and speculative_config says the same blocks, slots and bytes; the same budget
    without speculation gives more blocks (the head's K/V cost them)."""
    with engine(checkpoint, MTP, num_blocks=8) as e:
        weights = e.memory_report().weights_bytes
    first = plan(checkpoint, 2 ** 40, weights, MTP)
    budget = first.budget_bytes - first.usable_bytes + first.kv_groups.total_bytes // 2
    est = plan(checkpoint, budget, weights, MTP)
    with engine(checkpoint, MTP, cpu_memory_budget_bytes=budget) as e:
        report = e.memory_report()
    assert 0 < est.num_blocks < first.num_blocks
    assert {g["kind"]: (g["size"], g["bytes"]) for g in report.groups} == \
        {g.shape.kind: (g.slots or g.blocks, g.bytes) for g in est.kv_groups.groups}
    assert (report.num_blocks, report.kv_cache_bytes) == (est.num_blocks, est.kv_cache_bytes)
    assert report.kv_cache_bytes <= est.usable_bytes  # the pool fits the budget it was sized from
    without = plan(checkpoint, budget, weights, None)
    assert without.num_blocks > est.num_blocks
