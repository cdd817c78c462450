"""A checkpoint is checked before it replaces anything (#40 item 3): without tokenizer files transformers quietly
returned an empty tokenizer, the engine loaded, the app's status said it served, and every chat was refused. Each
missing or broken part is refused (minivlm.Refused, code "invalid_checkpoint") naming the file, by Engine(...) and by
the app's holder before it releases the engine that serves (which keeps its prefix cache); every checkpoint the
tests build, in every layout, passes; the refusal is said in Chinese from its fields."""
import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivlm import Engine, EngineConfig, Refused, Request, SamplingParams
from minivlm import checkpoint_check
from minivlm.refusals import render
from panels.holder import EngineHolder
from panels.i18n import CATALOGUE, EN, ZH, t
from panels.i18n.errors import localize_error

TINY = EngineConfig().model
CJK = re.compile(r"[\u4e00-\u9fff]")


def copy(src: str, tmp_path, name: str = "ckpt") -> str:
    return str(shutil.copytree(src, tmp_path / name))


def without(*names):
    def edit(path):
        for name in names:
            os.remove(os.path.join(path, name))
    return edit


def rewrite_weights(change):
    def edit(path):
        weights = load_file(os.path.join(path, "model.safetensors"))
        change(weights)
        save_file(weights, os.path.join(path, "model.safetensors"))
    return edit


def truncate(path):
    weights = os.path.join(path, "model.safetensors")
    with open(weights, "rb") as f:
        head = f.read(1000)
    with open(weights, "wb") as f:
        f.write(head)


def empty_vocab(path):
    with open(os.path.join(path, "tokenizer.json")) as f:
        tok = json.load(f)
    tok["model"]["vocab"], tok["model"]["merges"], tok["added_tokens"] = {}, [], []
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tok, f)


def shard_index_missing_a_file(path):
    weights = load_file(os.path.join(path, "model.safetensors"))
    names = sorted(weights)
    half = len(names) // 2
    save_file({k: weights[k] for k in names[:half]}, os.path.join(path, "model-00001-of-00002.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))  # the second shard never arrived
    index = {"metadata": {}, "weight_map": {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors"
                                            for i, k in enumerate(names)}}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)


def drop(pattern):
    return rewrite_weights(lambda w: [w.pop(k) for k in [k for k in w if re.search(pattern, k)]])


def resize_embedding(w):
    name = next(k for k in w if k.endswith("embed_tokens.weight"))
    w[name] = w[name][:10].clone()


# (what is broken, the edit, the refusal's reason, a file or words the message names)
BROKEN = [
    ("no tokenizer files", without("tokenizer.json", "tokenizer_config.json"), "checkpoint_no_tokenizer",
     "tokenizer.json is missing"),
    ("an empty tokenizer", empty_vocab, "checkpoint_small_vocab", "(tokenizer.json) has 0 tokens"),
    ("no chat template", without("chat_template.jinja"), "checkpoint_no_chat_template",
     "chat_template.jinja is missing"),
    ("no processor settings", without("processor_config.json"), "checkpoint_no_processor",
     "preprocessor_config.json is missing"),
    ("no weights", without("model.safetensors"), "checkpoint_no_weights", "has no *.safetensors weights"),
    ("truncated weights", truncate, "checkpoint_corrupt_weights", "corrupt weights file model.safetensors"),
    ("a shard missing", shard_index_missing_a_file, "checkpoint_missing_file",
     "missing model-00002-of-00002.safetensors"),
    ("a decoder layer missing", drop(r"layers\.1\."), "checkpoint_missing_layers", "(layer 1) are missing"),
    ("no embedding", drop(r"embed_tokens"), "checkpoint_no_embedding", "no token embedding"),
    ("another vocabulary's embedding", rewrite_weights(resize_embedding), "checkpoint_embedding_shape",
     "has 10 rows"),
]


@pytest.mark.parametrize("what, edit, reason, named", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_checkpoint_is_refused_naming_what_is_missing(tmp_path, what, edit, reason, named):
    path = copy(TINY, tmp_path)
    edit(path)
    with pytest.raises(Refused) as e:
        Engine(EngineConfig(model=path, device="cpu", num_blocks=16))
    error = e.value
    assert (error.code, error.reason, error.param) == ("invalid_checkpoint", reason, "model"), str(error)
    assert named in str(error) and "ckpt" in str(error), str(error)
    # said in Chinese from its fields; the catalogue's English, filled in, is the engine's own sentence
    assert t(EN, f"error.{reason}", **{k: render(v) for k, v in error.fields.items()}) == str(error)
    zh = localize_error(error, ZH)
    assert zh != str(error) and CJK.search(zh) and "ckpt" in zh


def test_every_reason_has_a_chinese_sentence():
    import inspect
    reasons = set(re.findall(r'refused\("(\w+)"', inspect.getsource(checkpoint_check)))
    assert len(reasons) >= 10 and all(f"error.{r}" in CATALOGUE for r in reasons), reasons


def test_the_tokenizer_transformers_built_is_checked_too(tmp_path, monkeypatch):
    """If the files pass (or a future layout is not read by check_files), what transformers built is looked at:
    a directory without tokenizer files gives a one-token tokenizer, refused."""
    path = copy(TINY, tmp_path)
    without("tokenizer.json", "tokenizer_config.json")(path)
    monkeypatch.setattr(checkpoint_check, "check_files", lambda model_dir: None)
    with pytest.raises(Refused, match=r"has 1 tokens where its config.json says vocab_size \d+") as e:
        Engine(EngineConfig(model=path, device="cpu", num_blocks=16))
    assert e.value.reason == "checkpoint_small_vocab"

    class NoTemplate:  # a tokenizer of the right size without a chat template
        chat_template = None

        def __len__(self):
            return 662
    with pytest.raises(Refused, match="has no chat template"):
        checkpoint_check.check_loaded(path, type("C", (), {"vocab_size": 662})(), NoTemplate())


def test_every_checkpoint_the_tests_build_passes(checkpoints, matrix_checkpoints, tmp_path):
    for path in [TINY, *checkpoints.values(), *matrix_checkpoints.values()]:
        checkpoint_check.check_files(path)
    # a sharded checkpoint (as the hub publishes the bigger ones), with its index: passes, and loads
    path = copy(TINY, tmp_path)
    weights = load_file(os.path.join(path, "model.safetensors"))
    names = sorted(weights)
    half = len(names) // 2
    for n, part in enumerate((names[:half], names[half:]), 1):
        save_file({k: weights[k] for k in part}, os.path.join(path, f"model-0000{n}-of-00002.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors"
                                                  for i, k in enumerate(names)}}, f)
    checkpoint_check.check_files(path)
    with Engine(EngineConfig(model=path, device="cpu", num_blocks=16)) as engine:
        assert engine.generate(Request(prompt="Hello"), SamplingParams(max_tokens=2)).token_ids


def test_the_holder_keeps_the_engine_that_serves_and_its_cache(tmp_path):
    """The header's path (panels/holder.py): the broken checkpoint is refused before the old engine is released."""
    holder = EngineHolder(EngineConfig(model=TINY, device="cpu", num_blocks=32))
    status = holder.load()
    good, builds = holder.engine, holder.builds
    hi = Request(prompt="hi there, how are you doing today my friend?")
    good.generate(hi, SamplingParams(max_tokens=1))
    path = copy(TINY, tmp_path, "no-tokenizer")
    without("tokenizer.json", "tokenizer_config.json")(path)
    with pytest.raises(Refused, match="checkpoint no-tokenizer has no tokenizer: tokenizer.json is missing"):
        holder.load(EngineConfig(model=path, device="cpu", num_blocks=32))
    assert holder.engine is good and holder.builds == builds and holder.status == status
    assert holder.config.model == TINY
    assert good.generate(hi, SamplingParams(max_tokens=1)).num_cached_tokens > 0  # its prefix cache, too
    good.close()
