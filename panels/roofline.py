"""Roofline tab: what one step of the engine must read and compute (minivlm.budget.roofline, the VRAM calculator's
byte counts), the bound this machine sets (minivlm.budget.machine: copy bandwidth and matmul rate, measured once per
process), and how close the engine's own steps come (minivlm.views.roofline_points: each step's time from the event
log). Any model preset is shown predicted only, on this machine's bound, without loading it."""
import gradio as gr
from gradio.context import Context

from minivlm.budget.machine import measure_machine
from minivlm.budget.roofline import image_cost, model_costs
from minivlm.budget.shapes import model_shape
from minivlm.views.roofline_points import engine_costs, measure_points, predicted_points

from panels.holder import EngineHolder, gpu
from panels.i18n import LANGUAGES, L, lang_of, t
from panels.i18n.errors import localize_error
from panels.page import TABLE_CELL_PX, TABLE_CHAR_PX, header_widths
from panels.sessions import collect_before_an_engine
from panels.roofline_figure import num, roofline_figure, sentence, table
from panels.vram import THIS_ENGINE, preset_choices

DTYPES = ["bfloat16", "float16", "float32", "int8", "int4"]
IMAGE_SIDE = 448  # the image line's picture: 448 × 448, a common size for every family


def machine_of(engine):
    """This machine's bound on the engine's device, in the dtype it computes in (cached per process)."""
    return measure_machine(engine.device, engine.memory_report().dtype)


def widths(headers) -> list[str]:
    """Each column as wide as its header's longest word or a number of 8 characters ("0.00188"), whichever is more:
    neither breaks inside."""
    return header_widths(headers, {i: f"{round(TABLE_CHAR_PX * max(8, *map(len, h.split())) + TABLE_CELL_PX)}px"
                                   for i, h in enumerate(headers)})


def machine_line(machine, lang: str) -> str:
    return t(lang, "roof.machine", device=machine.device, dtype=machine.dtype, gbs=num(machine.bandwidth / 1e9),
             copies=machine.copy_runs, gflops=num(machine.flops / 1e9), products=machine.matmul_runs,
             secs=f"{machine.seconds:.2f}", ridge=num(machine.ridge))


def image_line(config, dtype: str, machine, lang: str) -> str:
    """One image through the vision tower: its bytes and FLOPs, and the bound they set on this machine."""
    if not model_shape(config).has_vision:
        return t(lang, "roof.text_only")
    cost = image_cost(config, dtype, IMAGE_SIDE, IMAGE_SIDE)
    return t(lang, "roof.image", w=IMAGE_SIDE, h=IMAGE_SIDE, patches=f"{cost.notes['patches']:,}",
             weights=num(cost.parts["vision weights"] / 1e6), acts=num(cost.parts["vision activations"] / 1e6),
             gflop=num(cost.flops / 1e9), best=num(1e3 * machine.bound_s(cost.bytes, cost.flops)))


def build(holder: EngineHolder, switch: gr.Radio | None = None):
    """Lay out the tab and wire it (api names: roofline, roofline_measure). It draws when first opened (the
    machine is measured then, once per process), on a change of model or dtype, and in the switched language."""
    tab = Context.block  # the Tab this is built in: its first opening draws it
    gr.Markdown(L("roof.intro"))
    with gr.Row():
        model = gr.Dropdown(preset_choices(), value=THIS_ENGINE, label=L("roof.model"), elem_id="roof-model")
        dtype = gr.Dropdown(DTYPES, value="bfloat16", label=L("roof.dtype"), elem_id="roof-dtype")
        measure = gr.Button(L("roof.measure"), variant="primary", elem_id="roof-measure")
    machine_md = gr.Markdown(elem_id="roof-machine", label=L("roof.machine_label"))
    note = gr.Markdown(elem_id="roof-note", label=L("roof.note_label"))
    plot = gr.Plot(label=L("roof.plot"), elem_id="roof-plot")
    said = gr.Markdown(label=L("roof.sentences"), elem_id="roof-sentences")
    image_md = gr.Markdown(elem_id="roof-image", label=L("roof.image_label"))
    steps = gr.Dataframe(label=L("roof.table"), wrap=True, elem_id="roof-table",  # no header broken in a word
                         column_widths=widths(table([]).columns))
    measured = gr.State(None)  # this session's (engine id, points) measured (None: not measured)

    def draw(model_name, weights_dtype, run_of, request: gr.Request = None):
        lang = lang_of(request)
        engine = holder.get()
        machine = machine_of(engine)
        points = run_of[1] if run_of and run_of[0] == id(engine) else None  # a rebuilt engine is not measured yet
        try:
            if model_name == THIS_ENGINE:
                config, shown_dtype = engine.hf_config, engine.config.quantization or engine.memory_report().dtype
                shown = engine.config.model.rstrip("/").rsplit("/", 1)[-1]
                if points == []:  # measured, and no step came back timed
                    return machine_line(machine, lang), t(lang, "roof.no_times"), None, "", "", None
                if points:
                    head = t(lang, "roof.measured_note", n=len(points), steps=sum(p.steps for p in points))
                else:
                    head, points = t(lang, "roof.engine_note"), predicted_points(engine_costs(engine), machine)
            else:
                config, shown_dtype, shown = model_name, weights_dtype, model_name
                points = predicted_points(model_costs(model_name, weights_dtype), machine)
                head = t(lang, "roof.predicted_note", model=model_name, dtype=weights_dtype)
            lines = "\n".join(f"- {sentence(p, machine, lang)}" for p in points)
            if any((p.fraction or 0) > 1 for p in points):  # the bound was measured while the machine was busier
                lines += "\n\n" + t(lang, "roof.above")
            return (machine_line(machine, lang), head, roofline_figure(machine, points, shown, lang), lines,
                    image_line(config, shown_dtype, machine, lang), table(points, lang))
        except ValueError as e:
            raise gr.Error(localize_error(e, lang))

    @gpu
    def run(request: gr.Request = None):
        """Measure the machine again and the engine's steps (on an isolated pool of its weights) right after: a bound
        measured while the machine was busier would put a step above its roof."""
        engine = holder.get()
        machine = measure_machine(engine.device, engine.memory_report().dtype, fresh=True)
        collect_before_an_engine()  # the isolated pool freezes what is alive when it starts: no session garbage
        return (id(engine), measure_points(engine, machine)), THIS_ENGINE

    outputs = [machine_md, note, plot, said, image_md, steps]
    inputs = [model, dtype, measured]
    gr.on([model.change, dtype.change], draw, inputs, outputs, api_name="roofline", concurrency_id="roofline",
          show_progress="hidden")
    measure.click(run, None, [measured, model], api_name="roofline_measure", concurrency_id="roofline_measure",
                  concurrency_limit=1).then(draw, inputs, outputs, api_name=False, show_progress="hidden")
    if isinstance(tab, gr.Tab):
        tab.select(draw, inputs, outputs, api_name=False, concurrency_id="roofline", show_progress="hidden")
    if switch is not None:
        def relang(chosen, model_name, weights_dtype, points, request: gr.Request):
            LANGUAGES.set(request, chosen)
            return gr.update(choices=preset_choices(chosen)), *draw(model_name, weights_dtype, points, request)
        switch.change(relang, [switch, *inputs], [model, *outputs], api_name=False, concurrency_id="roofline",
                      show_progress="hidden")
