"""The cache inspector's "Same image, different tiling" preset on each family: key C reuses no block of the
picture under the other tiling, B (same pixels) is fooled on a tiled model and its answer's logprobs move, and a
choice the family has no knob for is refused, naming what it takes."""
import os

import pytest
from PIL import Image

from panels.cache_inspector import PRESETS, processor_kwargs, run_pair
from panels.holder import EXAMPLES_DIR

PRESET = PRESETS["Same image, different tiling"]


@pytest.mark.parametrize("name", ["smolvlm", "internvl"])
def test_same_image_other_tiling_fools_b_not_c(name, matrix_engines):
    engine = matrix_engines[name]
    a, b, prompt, _, r1, r2 = PRESET
    image = Image.open(os.path.join(EXAMPLES_DIR, a)).convert("RGB")
    kw = [processor_kwargs(engine, r) for r in (r1, r2)]
    results, cold = run_pair(engine, ((image, prompt, kw[0]), (image, prompt, kw[1])), 4)
    false_b = [h for h in results["B"][0].cache_hits if h.false_hit]
    assert false_b, "B should reuse the other tiling's image blocks"
    assert not any(h.false_hit for h in results["C"][0].cache_hits)
    drift_b = max(abs(lp[t] - cold.logprobs[i].get(t, lp[t])) for i, lp in enumerate(results["B"][0].logprobs)
                  for t in lp)
    assert drift_b > 1e-3  # the reused KV came from other pixels


def test_choices_a_family_cannot_take_are_refused(matrix_engines, engines):
    with pytest.raises(ValueError, match="tiles images instead of a max_pixels resize"):
        processor_kwargs(matrix_engines["smolvlm"], "max 160×160 px")
    with pytest.raises(ValueError, match="does not tile images"):
        processor_kwargs(engines["qwen3_vl"], "one view (no splitting)")
    assert processor_kwargs(engines["qwen3_vl"], "another tiling") == {"max_pixels": 160 * 160}
    assert processor_kwargs(matrix_engines["internvl"], "one view (no splitting)") == {"crop_to_patches": False}
