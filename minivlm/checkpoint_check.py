"""Is a checkpoint directory complete enough to serve? transformers loads a directory without tokenizer files as an
empty tokenizer and says nothing, so such a checkpoint would load, replace a working engine and then refuse every
chat. Two checks refuse it first, naming the file: `check_files` reads only the directory (config, tokenizer,
chat template, processor settings, the safetensors headers against the config's layers) and runs before anything is
released; `check_loaded` looks at what transformers built from it (the tokenizer's size, the chat template).
A refusal is a minivlm.Refused with code "invalid_checkpoint", param "model" and the sentence's fields."""
import glob
import json
import os
import re

from safetensors import safe_open

from minivlm.families import FAMILIES
from minivlm.refusals import Refused

CODE = "invalid_checkpoint"
VOCAB_SLACK = 10  # a tokenizer this many times smaller than the config's vocab_size is not this model's
# a text decoder layer's weight in every layout the loader reads (Qwen 5.x and older, InternVL, SmolVLM, text-only)
TEXT_LAYER = re.compile(r"^(?:model\.)?(?:language_model\.|text_model\.)?(?:model\.)?layers\.(\d+)\.")
TEXT_EMBED = re.compile(r"^(?:model\.)?(?:language_model\.|text_model\.)?(?:model\.)?embed_tokens\.weight$")


def refused(reason: str, template: str, **fields) -> Refused:
    return Refused(CODE, template, reason=reason, param="model", **fields)


def read_json(path: str) -> dict | None:
    """A JSON file's object (None when the file is absent; a refusal when it is there but unreadable)."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refused("checkpoint_unreadable", "checkpoint {dir}: {file} is not readable JSON ({detail})",
                      dir=path_name(os.path.dirname(path)), file=os.path.basename(path),
                      detail=str(e).splitlines()[0][:160]) from None
    return value if isinstance(value, dict) else {}


def path_name(model_dir: str) -> str:
    return os.path.basename(os.path.normpath(model_dir)) or model_dir


def vocab_size(config: dict) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    n = text.get("vocab_size") or config.get("vocab_size")
    return n if isinstance(n, int) and n > 0 else None


def num_layers(config: dict) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    n = text.get("num_hidden_layers") or config.get("num_hidden_layers")
    return n if isinstance(n, int) and n > 0 else None


def tokenizer_size(model_dir: str) -> tuple[str, int | None] | None:
    """(the tokenizer file, how many tokens it defines; None: not countable without loading it), or None: none."""
    fast = read_json(os.path.join(model_dir, "tokenizer.json"))
    if fast is not None:
        model = fast.get("model") if isinstance(fast.get("model"), dict) else {}
        vocab = model.get("vocab") or []
        ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
        ids.update(t.get("id") for t in fast.get("added_tokens") or [] if isinstance(t, dict))
        return "tokenizer.json", len(ids)
    slow = read_json(os.path.join(model_dir, "vocab.json"))
    if slow is not None and os.path.isfile(os.path.join(model_dir, "merges.txt")):
        return "vocab.json", len(slow)
    if os.path.isfile(os.path.join(model_dir, "tokenizer.model")):
        return "tokenizer.model", None if os.path.getsize(os.path.join(model_dir, "tokenizer.model")) else 0
    return None


def has_chat_template(model_dir: str) -> bool:
    if any(os.path.isfile(os.path.join(model_dir, f)) and os.path.getsize(os.path.join(model_dir, f))
           for f in ("chat_template.jinja", "chat_template.json")):
        return True
    if glob.glob(os.path.join(model_dir, "additional_chat_templates", "*.jinja")):
        return True
    for name in ("tokenizer_config.json", "processor_config.json"):
        if (read_json(os.path.join(model_dir, name)) or {}).get("chat_template"):
            return True
    return False


def weight_names(model_dir: str, name: str) -> dict[str, list[int]]:
    """Every tensor the checkpoint's safetensors files hold -> its shape (from their headers only), a missing or
    corrupt file refused by name."""
    index = read_json(os.path.join(model_dir, "model.safetensors.index.json"))
    files = sorted(set((index or {}).get("weight_map", {}).values())) if index else []
    for f in files:
        if not os.path.isfile(os.path.join(model_dir, f)):
            raise refused("checkpoint_missing_file", "checkpoint {dir} is missing {file} (its weights index lists "
                          "it): copy the whole checkpoint again", dir=name, file=f)
    paths = [os.path.join(model_dir, f) for f in files] or sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not paths:
        raise refused("checkpoint_no_weights", "checkpoint {dir} has no *.safetensors weights", dir=name)
    names = {}
    for path in paths:
        try:
            with safe_open(path, "pt") as f:
                names.update((k, list(f.get_slice(k).get_shape())) for k in f.keys())
        except Exception as e:  # truncated, not safetensors at all: the header does not parse
            raise refused("checkpoint_corrupt_weights", "corrupt weights file {file} in checkpoint {dir}: {detail}",
                          file=os.path.basename(path), dir=name, detail=str(e).splitlines()[0][:160]) from None
    return names


def check_files(model_dir: str) -> None:
    """Refuse (minivlm.Refused, code "invalid_checkpoint") a checkpoint directory that lacks what serving needs,
    naming the file. Reads files only: no tokenizer or weights are loaded. A directory whose config.json is missing
    or names a model minivlm does not run is left to the loader, which says why."""
    name = path_name(model_dir)
    try:
        config = read_json(os.path.join(model_dir, "config.json"))
    except Refused:
        return  # the loader says what is wrong with config.json
    family = FAMILIES.get((config or {}).get("model_type"))
    if config is None or family is None:
        return
    names = weight_names(model_dir, name)
    layers = num_layers(config)
    text = {int(m.group(1)) for n in names if (m := TEXT_LAYER.match(n))}
    missing = [i for i in range(layers or 0) if i not in text]
    if missing:
        raise refused("checkpoint_missing_layers", "the weights of checkpoint {dir} do not cover its config.json: "
                      "{count} of its {n} decoder layers (layer {layers}) are missing from its *.safetensors files",
                      dir=name, count=len(missing), n=layers,
                      layers=", ".join(map(str, missing[:4])) + (" …" if len(missing) > 4 else ""))
    embedding = next((shape for n, shape in names.items() if TEXT_EMBED.match(n)), None)
    if embedding is None:
        raise refused("checkpoint_no_embedding", "the weights of checkpoint {dir} have no token embedding "
                      "(embed_tokens): its *.safetensors files are incomplete", dir=name)
    if vocab_size(config) and embedding[:1] != [vocab_size(config)]:
        raise refused("checkpoint_embedding_shape", "the token embedding of checkpoint {dir} has {rows} rows where its "
                      "config.json says vocab_size {vocab}: the weights are not this config's", dir=name,
                      rows=embedding[0] if embedding else 0, vocab=vocab_size(config))
    found = tokenizer_size(model_dir)
    if found is None:
        raise refused("checkpoint_no_tokenizer", "checkpoint {dir} has no tokenizer: {file} is missing (and no "
                      "tokenizer.model, nor vocab.json + merges.txt); copy the tokenizer files from the model's hub "
                      "page", dir=name, file="tokenizer.json")
    check_vocab(name, found[0], found[1], vocab_size(config))
    if not has_chat_template(model_dir):
        refuse_template(name)
    if family.images != "none" and not os.path.isfile(os.path.join(model_dir, "preprocessor_config.json")) and \
            "image_processor" not in (read_json(os.path.join(model_dir, "processor_config.json")) or {}):
        raise refused("checkpoint_no_processor", "checkpoint {dir} has no image processor settings: {file} is "
                      "missing (nor an image_processor in processor_config.json)", dir=name,
                      file="preprocessor_config.json")


def refuse_template(name: str):
    raise refused("checkpoint_no_chat_template", "checkpoint {dir} has no chat template: {file} is missing (nor "
                  "chat_template.json, nor a chat_template in tokenizer_config.json)", dir=name,
                  file="chat_template.jinja")


def check_vocab(name: str, file: str, tokens: int | None, expected: int | None):
    if tokens is None:
        return
    if tokens <= 1 or expected and tokens * VOCAB_SLACK < expected:
        raise refused("checkpoint_small_vocab", "the tokenizer of checkpoint {dir} ({file}) has {n} tokens where its "
                      "config.json says vocab_size {vocab}: it is empty or not this model's tokenizer", dir=name,
                      file=file, n=tokens, vocab=expected or "?")


def check_loaded(model_dir: str, hf_config, processor) -> None:
    """What transformers built from the checkpoint: a tokenizer of about the config's vocabulary, and a chat
    template (transformers returns an empty tokenizer for a directory without one instead of failing)."""
    name = path_name(model_dir)
    tokenizer = getattr(processor, "tokenizer", processor)
    text_config = getattr(hf_config, "text_config", None) or hf_config
    file = next((f for f in ("tokenizer.json", "vocab.json", "tokenizer.model")
                 if os.path.isfile(os.path.join(model_dir, f))), "tokenizer.json")
    check_vocab(name, file, len(tokenizer), getattr(text_config, "vocab_size", None))
    if not (getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)):
        refuse_template(name)


def loading_processor(model_dir: str, load):
    """`load()` (the checkpoint's processor), a failure refused naming the checkpoint and the error."""
    try:
        return load()
    except Refused:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise refused("checkpoint_processor", "the processor of checkpoint {dir} could not be loaded: {detail}",
                      dir=path_name(model_dir), detail=" ".join(str(e).split())[:300]) from e
