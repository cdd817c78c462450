"""The cache inspector's hybrid preset: key A fooled on a hybrid model (Qwen3.5). Two requests with the same text and
another image: under A the second one's prompt blocks get the first one's keys, and on a hybrid model a prefix hit
restores more than K/V: Qwen3.5's recurrent layers resume from the state checkpointed at the hit's last token (Gemma
3's sliding layers reuse the window's blocks before it), so that state is the other image's too; B and C miss.
It runs on the served engine when that one is hybrid, else on a random-weight Qwen3.5 test checkpoint made once into
the temp dir (tools/make_checkpoint_qwen3_5.py, as the tests make theirs) and loaded on the CPU for the process."""
import os
import tempfile
import threading

from minivlm import Engine, EngineConfig

from panels.group_replay import hybrid
from panels.i18n import EN, t

PRESET = ("Hybrid model: same text, different image", "red_circle.png", "blue_circle.png", "What color is the shape?")
CHECKPOINT = os.path.join(tempfile.gettempdir(), "minivlm-random-qwen3_5")
# a group kind -> (how a hit restores it, what the hit restored): the note's words
RESTORES = {"recurrent": ("insp.what_state", "insp.restored_state"),
            "sliding_window": ("insp.what_window", "insp.restored_window")}
_lock = threading.Lock()
_made: dict[str, Engine] = {}


def group_kinds(engine) -> list[str]:
    """The engine's KV-cache group kinds (full_attention first)."""
    return [g.kind for g in engine.snapshot().groups]


def random_qwen3_5() -> str:
    """The test checkpoint's directory, made on first use (into a sibling first, so a half-written one is never
    loaded by another process)."""
    if not os.path.exists(os.path.join(CHECKPOINT, "model.safetensors")):
        from tools.make_checkpoint_qwen3_5 import make_qwen3_5_checkpoint
        part = tempfile.mkdtemp(prefix="minivlm-random-qwen3_5-")
        make_qwen3_5_checkpoint(part, seed=0)
        try:
            os.replace(part, CHECKPOINT)
        except OSError:  # another process made it meanwhile
            pass
    return CHECKPOINT


def hybrid_engine(served: Engine) -> tuple[Engine, bool]:
    """(the engine the preset runs on, whether it is the random test model rather than the served one)."""
    if hybrid(served.snapshot().groups):
        return served, False
    with _lock:
        if "qwen3_5" not in _made:
            _made["qwen3_5"] = Engine(EngineConfig(model=random_qwen3_5(), device="cpu", dtype="float32",
                                                   num_blocks=64, max_model_len=1024, max_num_seqs=4))
        return _made["qwen3_5"], True


def note(engine: Engine, made: bool, results: dict, lang: str = EN) -> str:
    """The preset's lesson in a paragraph, with this run's numbers and what this model's hit restores besides the
    full-attention K/V (results: strategy -> (output 2, output 1))."""
    a = results["A"][0]
    false = sum(h.false_hit for h in a.cache_hits)
    where = t(lang, "insp.hybrid_random") if made else t(lang, "insp.hybrid_served", model=engine.family.title)
    missed = [s for s, (second, _) in results.items() if s != "A" and not second.cache_hits]
    kinds = group_kinds(engine)
    parts = [said for kind, said in RESTORES.items() if kind in kinds]
    what = t(lang, "plan.sep").join(t(lang, how) for how, _ in parts)
    restored = "".join(t(lang, which, n=a.num_cached_tokens) for _, which in parts) if a.cache_hits else ""
    return t(lang, "insp.hybrid_note", where=where, what=what, hits=len(a.cache_hits), false=false,
             n=a.num_cached_tokens, restored=restored, others=", ".join(missed) or "—")
