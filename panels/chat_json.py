"""The Chat tab's JSON answer (#42): a JSON Schema box (empty = a free answer) with presets for the tiny model's
pictures, the answer held to the schema by the engine's grammar (structured outputs: valid JSON by construction,
whatever the model would have written), and the answer parsed under the chat. The KV tab's step-through shows each
constrained step: how many tokens the grammar allowed and which one was chosen."""
import json

import gradio as gr

from minivlm import StructuredOutputsParams

from panels.i18n import L, t

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange"]  # the tiny model's pictures (tools/scenes.py)
SHAPES = ["circle", "square", "triangle"]
POSITIONS = ["top left", "top center", "top right", "middle left", "center", "middle right", "bottom left",
             "bottom center", "bottom right"]


def closed(required: list[str], **properties) -> dict:
    """An object with exactly these properties (every string bounded: a small model writes free text until its
    token limit)."""
    return {"type": "object", "additionalProperties": False, "required": required, "properties": properties}


PRESETS = {  # preset -> schema; labels chat.json_preset.<preset>
    "shapes": closed(["shapes"], shapes={"type": "array", "minItems": 1, "maxItems": 3, "items": closed(
        ["colour", "shape", "position"], colour={"enum": COLOURS}, shape={"enum": SHAPES},
        position={"enum": POSITIONS})}),
    "one_shape": closed(["colour", "shape"], colour={"enum": COLOURS}, shape={"enum": SHAPES}),
    "count": closed(["count"], count={"type": "integer", "minimum": 0, "maximum": 9}),
    "yes_no": closed(["answer", "sure"], answer={"enum": ["yes", "no"]}, sure={"type": "boolean"}),
}


PRESET_CHOICES = [(L("chat.json_preset.none"), "none"), (L("chat.json_preset.shapes"), "shapes"),
                  (L("chat.json_preset.one_shape"), "one_shape"), (L("chat.json_preset.count"), "count"),
                  (L("chat.json_preset.yes_no"), "yes_no")]
JSON_TOKENS = 200  # what a preset raises max tokens to: JSON spends many tokens on the tiny model's small vocabulary


def more_room(preset: str, max_tokens: float):
    """A preset raises the max-tokens slider to JSON_TOKENS (never lowers it)."""
    return gr.update(value=max(int(max_tokens), JSON_TOKENS)) if preset in PRESETS else gr.skip()


def preset_schema(preset: str) -> str:
    """The schema box's text for a preset ("" for none: a free answer)."""
    return json.dumps(PRESETS[preset], indent=1) if preset in PRESETS else ""


def structured(schema_text: str | None, lang: str) -> StructuredOutputsParams | None:
    """The schema box as the engine's structured outputs (None when empty); a box that is not a JSON object is a
    ValueError the chat shows as a refusal (a schema the grammar cannot compile is the engine's refusal)."""
    text = (schema_text or "").strip()
    if not text:
        return None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(t(lang, "chat.json_not_json", error=str(e))) from None
    if not isinstance(schema, dict):
        raise ValueError(t(lang, "chat.json_not_object"))
    return StructuredOutputsParams(json=schema)


def parsed(history: list[dict], schema_text: str | None, lang: str):
    """(the last answer parsed, the line under it) once an answer to a JSON question is complete."""
    if not (schema_text or "").strip() or not history or history[-1]["role"] != "assistant" \
            or (history[-1].get("metadata") or {}).get("title"):
        return None, ""
    content = history[-1]["content"]
    parts = content if isinstance(content, list) else [content]
    text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in parts if isinstance(p, dict))
    try:
        return json.loads(text), t(lang, "chat.json_parsed")
    except json.JSONDecodeError:  # only a capped answer: the grammar lets nothing else end
        return None, t(lang, "chat.json_unfinished")


def build():
    """The JSON-answer accordion: (schema box, preset picker, parsed result, its line)."""
    with gr.Accordion(L("chat.json_answer"), open=False, elem_id="chat-json"):
        gr.Markdown(L("chat.json_about"))
        with gr.Row():
            preset = gr.Dropdown(PRESET_CHOICES, value="none", label=L("chat.json_preset"), elem_id="chat-json-preset",
                                 scale=1)
            schema = gr.Code("", language="json", label=L("chat.json_schema"), elem_id="chat-json-schema", scale=2)
        result = gr.JSON(label=L("chat.json_result"), elem_id="chat-json-result")
        line = gr.Markdown(elem_id="chat-json-line", label=L("chat.json_result_line"))
    preset.change(preset_schema, preset, schema, api_name=False, queue=False)
    return schema, preset, result, line
