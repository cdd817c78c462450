"""What constrains an answer, read from the OpenAI request: `response_format` (json_object, json_schema), vLLM's
`structured_outputs`, and `tools` with `tool_choice`. The result is the engine's StructuredOutputsParams (the grammar
the answer must follow), the request field a grammar fault is reported under, and how the answer is read back: as
text, or as tool calls (minivlm/api/tool_calls.py). `required` and a named function are grammars too: the model
cannot write anything but valid calls."""
from dataclasses import dataclass

from minivlm.api.errors import ApiError, from_engine
from minivlm.api.protocol import ChatCompletionRequest
from minivlm.engine.request import StructuredOutputsParams
from minivlm.refusals import Refused

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}  # a function without parameters


@dataclass
class Constraint:
    """How one request's answer is constrained and read."""
    structured: StructuredOutputsParams | None = None
    field: str | None = None           # the request field a grammar fault names (None: the engine's own name)
    tool_mode: str = "none"            # none | auto | required | named: how the answer is read back
    function: str | None = None        # named: the function every call is to
    parallel: bool = True              # parallel_tool_calls
    schemas: dict | None = None        # auto: each tool's parameters (they type a call written in Qwen's XML form)


def tool_params(tool) -> dict:
    return NO_ARGUMENTS if tool.function.parameters is None else tool.function.parameters


def required_schema(tools, parallel: bool) -> dict:
    """tool_choice=required as vLLM constrains it: a JSON array of {"name", "parameters"} objects, each naming one of
    the tools and holding arguments valid for that tool's schema (name first, so a stream can name the call early)."""
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"enum": [t.function.name]}, "parameters": tool_params(t)}} for t in tools]
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
            "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}


def answer_format(req: ChatCompletionRequest) -> tuple[StructuredOutputsParams | None, str | None]:
    """response_format or structured_outputs (at most one) as the engine's params, with the field that names it."""
    rf, so = req.response_format, req.structured_outputs
    fmt = rf.type if rf is not None else "text"
    if fmt != "text" and so is not None:
        raise ApiError(400, "give response_format or structured_outputs, not both", param="structured_outputs",
                       code="invalid_value")
    try:
        if so is not None:
            return StructuredOutputsParams(json=so.json_, json_object=bool(so.json_object), regex=so.regex,
                                           choice=so.choice, grammar=so.grammar), None
        if fmt == "json_object":
            return StructuredOutputsParams(json_object=True), "response_format"
        if fmt == "json_schema":
            if rf.json_schema is None:
                raise ApiError(400, "response_format type 'json_schema' needs its json_schema object",
                               param="response_format.json_schema", code="invalid_value")
            return StructuredOutputsParams(json=rf.json_schema.schema_), "response_format.json_schema.schema"
    except Refused as e:
        raise from_engine(e) from None
    return None, None


def constraint(req: ChatCompletionRequest) -> Constraint:
    """The request's Constraint, or a 400 naming the field that asks for something impossible."""
    structured, field = answer_format(req)
    tools, choice = req.tools or [], req.tool_choice
    mode = choice if isinstance(choice, str) else "named" if choice is not None else "auto" if tools else "none"
    parallel = req.parallel_tool_calls is not False
    if mode != "none" and not tools:
        raise ApiError(400, f"tool_choice {'a named function' if mode == 'named' else repr(mode)} needs tools",
                       param="tool_choice", code="invalid_value")
    if mode != "none" and structured is not None:
        raise ApiError(400, f"tool_choice {'a named function' if mode == 'named' else repr(mode)} decides the answer's "
                            f"format, which {'structured_outputs' if field is None else 'response_format'} also "
                            f"asks for: set tool_choice to 'none' or drop one of them", param="tool_choice",
                       code="invalid_value")
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise ApiError(400, "two tools have the same function name", param="tools", code="invalid_value")
    if mode == "required":
        return Constraint(StructuredOutputsParams(json=required_schema(tools, parallel)), "tools", mode,
                          parallel=parallel)
    if mode == "named":
        if choice.function.name not in names:
            raise ApiError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools "
                                f"({', '.join(names)})", param="tool_choice.function.name", code="invalid_value")
        i = names.index(choice.function.name)
        return Constraint(StructuredOutputsParams(json=tool_params(tools[i])), f"tools[{i}].function.parameters",
                          mode, choice.function.name, parallel)
    schemas = {t.function.name: tool_params(t) for t in tools} if mode == "auto" else None
    return Constraint(structured, field, mode, parallel=parallel, schemas=schemas)


def check_tools(engine, req: ChatCompletionRequest):
    """Every tool's parameters compile as a JSON Schema (the engine's grammar compiler, cached), so a bad tool is a
    400 naming it even when the model is free to ignore it. Call off the event loop: a compile may take a while."""
    for i, tool in enumerate(req.tools or []):
        param = f"tools[{i}].function.parameters"
        if not isinstance(tool_params(tool), dict):
            raise ApiError(400, f"{param} must be a JSON Schema object", param=param, code="invalid_value")
        try:
            engine.intake.grammars().compiled(StructuredOutputsParams(json=tool_params(tool)))
        except Refused as e:
            raise renamed(e, param) from None


def renamed(error: Refused, field: str | None) -> ApiError:
    """A grammar refusal from the engine (it names structured_outputs.<kind>) under the field the client sent."""
    api = from_engine(error)
    if field is not None and (api.param or "").startswith("structured_outputs"):
        api.message = api.message.replace(api.param, field, 1)
        api.param = field
    return api
