"""The Timeline tab's load generator refuses N, R and T outside their limits (at each edge, for the private app and
a shared deployment) with a sentence naming the field and its limit, before any engine is touched."""

import gradio as gr
import pytest

from panels.request_timeline import compare
from panels.request_timeline_load import LIMITS, check_limits


class NoEngine:
    """A holder whose engine must not be asked for: a refused run never reaches it."""

    def __init__(self, shared: bool):
        self.shared = shared

    def get(self):
        raise AssertionError("a refused run asked for the engine")


@pytest.mark.parametrize("shared", [False, True])
def test_each_limit_is_inclusive_and_one_past_it_is_refused_naming_it(shared):
    most_n, most_r, most_t = LIMITS[shared]
    assert check_limits(1, 0.1, 1.0, shared) is None and check_limits(most_n, most_r, most_t, shared) is None
    for args, wrong in (((0, 1, 5), "requests"), ((most_n + 1, 1, 5), "requests"),
                        ((2, 0.09, 5), "rate"), ((2, most_r + 0.01, 5), "rate"), ((2, 1, 0.5), "seconds"),
                        ((2, 1, most_t + 1), "seconds"), ((float("nan"), 1, 5), "requests"), (("8", 1, 5), "requests"),
                        ((2, None, 5), "rate")):
        assert check_limits(*args, shared) == wrong, args
    with pytest.raises(gr.Error) as e:
        compare(NoEngine(shared), most_n + 1, 1.0, 5.0, "chunked", "en", None)
    assert f"N (requests) must be between 1 and {most_n} (got {most_n + 1})" in str(e.value)
    with pytest.raises(gr.Error) as e:
        compare(NoEngine(shared), 2, 1.0, most_t + 1, "chunked", "zh-CN", None)
    assert f"T（秒）必须在 1.0 到 {most_t} 之间" in str(e.value)
    with pytest.raises(gr.Error, match="setting"):
        compare(NoEngine(shared), 2, 1.0, 5.0, "turbo", "en", None)
