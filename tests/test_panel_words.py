"""Words that match what a person sees (#24 item 16): each sentence checked against the number it describes."""
import os

import pytest

from minivlm import Engine, EngineConfig, Request
from minivlm.budget import estimate, load_model_preset

from panels.anatomy_figures import offset, rope_figure
from panels.cache_inspector import PRESETS, _example, drift_meaning, processor_kwargs, results_table, run_pair
from panels.vram import headline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_vram_verdict_never_contradicts_itself():
    config = load_model_preset("Qwen2.5-VL-7B-Instruct")
    # four images no longer fit the 4,096-token context (the walkthrough's case): the pool would still hold
    # a number of such requests at once, which a "Does not fit" verdict must not announce
    est = estimate(config, max_model_len=4096, num_seqs=8, images_per_request=4, device="L4")
    assert not est.fits and est.limits
    text = headline(est, "L4", 8)
    assert text.startswith("### Does not fit on L4") and "requests at once" not in text
    assert all(f"**{limit}**" in text for limit in est.limits)
    fits = estimate(config, max_model_len=4096, num_seqs=2, images_per_request=1, device="L4")
    assert fits.fits and f"**{fits.workload_concurrency:,}** requests at once (asked for 2)" in headline(fits, "L4", 2)


@pytest.mark.parametrize("delta, words", [(-56, "i − 56"), (3, "i + 3"), (0, "i")])
def test_the_rope_delta_is_written_as_a_person_writes_it(delta, words):
    assert offset(delta) == words


def test_the_mrope_subtitle_names_the_tiny_models_delta():
    with Engine(EngineConfig(device="cpu")) as engine:
        a = engine.anatomy(Request(prompt="What color is the shape?", images=[_example("red_circle.png")]))
    title = rope_figure(a).layout.title.text
    assert a.rope_delta < 0 and f"position i − {-a.rope_delta} on all three axes" in title and "i -" not in title


def test_the_inspector_says_what_each_drift_means():
    assert drift_meaning(0.0) == "none: bit-identical"
    assert drift_meaning(5.7e-6) == "float rounding only" and "not this request's" in drift_meaning(2.5)
    with Engine(EngineConfig(device="cpu")) as engine:
        a, b, p1, p2, r1, r2 = PRESETS["Identical"]
        out, cold = run_pair(engine, ((_example(a), p1, processor_kwargs(engine, r1)),
                                      (_example(b), p2 or p1, processor_kwargs(engine, r2))), 4)
        table = results_table(out, cold).set_index("strategy")
    for strategy in "ABC":  # true hits: whatever the rounding, the words say it is rounding (or nothing)
        row = table.loc[strategy]
        assert row["false hits"] == 0 and row["hits"] > 0
        assert row["so the drift is"] in ("none: bit-identical", "float rounding only"), row
        assert float(row["max |Δlogprob| vs cold"]) < 1e-4


def test_the_anatomy_size_slider_shows_its_default_and_steps_in_tokens():
    from panels.anatomy import knob_label, pixel_range
    with Engine(EngineConfig(device="cpu")) as engine:
        lo, hi, step, default = pixel_range(engine)
        label = knob_label(engine)
    assert (default - lo) / (hi - lo) > 0.2  # not squeezed against the left end of a linear track
    assert step == 256 and "one step = one token = 256 px" in label and (default - lo) % step == 0
