"""The Timeline tab: a bounded load generator (N image requests at R per second, at most T seconds) run twice on
engines of the session's own, once without and once with one setting, and the two runs' wall-clock timelines one
above the other, their step-time histograms and their percentiles side by side. Every figure is read from the runs'
event logs (minivlm.views.timeline); the shared engine never sees this load."""
import gradio as gr

from panels.access import refusal
from panels.holder import EngineHolder, gpu
from panels.i18n import L, lang_of, t
from panels.request_timeline_figure import gantt_figure, percentile_rows, step_histogram
from panels.request_timeline_load import (LEAST, LIMITS, MAX_TOKENS, POOL_BLOCKS, SETTINGS, Busy, check_limits,
                                          run_load)

DEFAULTS = (8, 4.0, 20.0)  # N, R, T: a few seconds of work on the shipped model
# each setting: (its menu entry, its short name in a run's label)
SETTING_WORDS = {"chunked": ("tl.set.chunked", "tl.short.chunked"),
                 "async_vision": ("tl.set.async_vision", "tl.short.async_vision"),
                 "small_pool": ("tl.set.small_pool", "tl.short.small_pool"),
                 "speculation": ("tl.set.speculation", "tl.short.speculation")}
INPUT_WORDS = {"requests": "tl.what.requests", "rate": "tl.what.rate", "seconds": "tl.what.seconds"}


def run_label(lang: str, setting: str, enabled: bool) -> str:
    return t(lang, "tl.label_on" if enabled else "tl.label_off", setting=t(lang, SETTING_WORDS[setting][1]))


def compare(holder: EngineHolder, n, rate, seconds, setting: str, lang: str, salt: str | None):
    """Both runs, then what the tab shows: summary, Gantt A, Gantt B, histogram, table (header, rows)."""
    wrong = check_limits(n, rate, seconds, holder.shared)
    if wrong is not None:
        i = ("requests", "rate", "seconds").index(wrong)
        raise refusal(t(lang, "tl.bad_input", what=t(lang, INPUT_WORDS[wrong]), low=LEAST[i],
                        high=LIMITS[holder.shared][i], got=repr((n, rate, seconds)[i])))
    if setting not in SETTINGS:
        raise refusal(t(lang, "tl.bad_input", what=t(lang, "tl.setting"), low=min(SETTINGS), high=max(SETTINGS),
                        got=repr(setting)))
    try:
        runs = [run_load(holder.get(), int(n), float(rate), float(seconds), setting, on, salt) for on in (False, True)]
    except Busy:
        raise refusal(t(lang, "tl.busy")) from None
    labelled = [(run_label(lang, setting, r.enabled), r.events) for r in runs]
    figs = [gantt_figure(events, t(lang, "tl.title", label=label, n=r.submitted,
                                   steps=len({e.step for e in events if e.kind == "scheduled"})), lang)
            for (label, events), r in zip(labelled, runs)]
    a, b = runs
    summary = t(lang, "tl.summary", a=labelled[0][0], na=a.submitted, aa=a.aborted, sa=f"{a.seconds:.1f}",
                b=labelled[1][0], nb=b.submitted, ab=b.aborted, sb=f"{b.seconds:.1f}", blocks=POOL_BLOCKS,
                tokens=MAX_TOKENS)
    header, rows = percentile_rows(labelled, lang)
    return summary, figs[0], figs[1], step_histogram(labelled, lang), {"headers": header, "data": rows}


def build(holder: EngineHolder, switch=None):
    most_n, most_r, most_t = LIMITS[holder.shared]
    gr.Markdown(L("tl.intro"), elem_id="tl-intro")
    with gr.Row(equal_height=True):
        n = gr.Number(DEFAULTS[0], label=t("en", "tl.requests", low=LEAST[0], high=most_n), precision=0,
                      elem_id="tl-n")  # its bounds are checked by compare(): the refusal names the field and its limit
        rate = gr.Number(DEFAULTS[1], label=t("en", "tl.rate", low=LEAST[1], high=most_r),
                         elem_id="tl-rate")
        seconds = gr.Number(DEFAULTS[2], label=t("en", "tl.seconds", low=LEAST[2], high=most_t),
                            elem_id="tl-seconds")
    with gr.Row(equal_height=True):
        setting = gr.Dropdown([(t("en", SETTING_WORDS[k][0]), k) for k in SETTINGS], value="chunked",
                              label=L("tl.setting"),
                              elem_id="tl-setting")
        go_btn = gr.Button(L("tl.run"), variant="primary", elem_id="tl-run")
    summary = gr.Markdown(L("tl.empty"), elem_id="tl-summary", label=L("tl.summary"))
    gantt_a = gr.Plot(label=L("tl.gantt_a"), elem_id="tl-gantt-a")
    gantt_b = gr.Plot(label=L("tl.gantt_b"), elem_id="tl-gantt-b")
    table = gr.Dataframe(label=L("tl.table"), elem_id="tl-table", interactive=False, wrap=True)
    hist = gr.Plot(label=L("tl.hist"), elem_id="tl-hist")

    def relabel(lang):  # the labels that carry this deployment's limits, in the chosen language
        return (gr.update(label=t(lang, "tl.requests", low=LEAST[0], high=most_n)),
                gr.update(label=t(lang, "tl.rate", low=LEAST[1], high=most_r)),
                gr.update(label=t(lang, "tl.seconds", low=LEAST[2], high=most_t)),
                gr.update(choices=[(t(lang, SETTING_WORDS[k][0]), k) for k in SETTINGS]))
    if switch is not None:
        switch.change(relabel, switch, [n, rate, seconds, setting], api_name=False, queue=False)

    @gpu(duration=int(2 * most_t + 60))  # ZeroGPU: both runs, each at most T, and two engines built
    def run_both(n_value, rate_value, seconds_value, which, request: gr.Request):
        lang = lang_of(request)
        salt = holder.salt(request.session_hash) if request is not None else None
        text, a, b, h, tab = compare(holder, n_value, rate_value, seconds_value, which, lang, salt)
        return text, a, b, tab, h

    go_btn.click(run_both, [n, rate, seconds, setting], [summary, gantt_a, gantt_b, table, hist],
                 api_name="timeline_compare", concurrency_limit=1)
