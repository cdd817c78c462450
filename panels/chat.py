"""Chat tab: image + text in, the answer streams out token by token; multi-turn, stop, sampling controls, and a
JSON answer held to a schema (panels/chat_json.py). Its layout and event handlers; the conversation as the engine reads
it is panels/chat_turns.py's."""
import os
import threading
import time

import gradio as gr

from minivlm import Request, SamplingParams

from panels import chat_json
from panels.access import refusal
from panels.chat_hints import HINT_TITLE, hint, knows_chinese, trained_questions, trained_summary  # noqa: F401
from panels.chat_stream import AnswerStream
from panels.chat_turns import (ERROR_TITLES, VIDEO_EXTENSIONS, finished_text, parse_seed, refuse,  # noqa: F401
                               to_hf_messages, turn_files, user_turn)
from panels.holder import EXAMPLES_DIR, EngineHolder, gpu
from panels.i18n import EN, LANGUAGES, L, lang_of, t, word

ERROR_TITLE = t(EN, "chat.error_title")
PAUSED_NOTE = t(EN, "chat.paused")
REBUILT_MARK = "⟳"  # how the chat's line starts when it speaks of a rebuild (chat.cleared_for_model, chat.rebuilt_note)
EXAMPLES = [("red_circle.png", "Describe the picture."), ("blue_circle.png", "What color is the shape?"),
            ("green_triangle.png", "What shape is it?"), ("yellow_square.png", "Where is the yellow square?"),
            ("two_shapes.png", "Describe the picture."), ("three_shapes.png", "Describe the picture."),
            ("three_shapes.png", "Where is the green circle?"), ("two_shapes.png", "How many shapes are there?")]
ZH_EXAMPLES = [("red_circle.png", "描述这张图片。"), ("blue_circle.png", "这个形状是什么颜色？"),
               ("green_triangle.png", "这是什么形状？"), ("three_shapes.png", "描述这张图片。"),
               ("three_shapes.png", "绿色的圆形在哪里？"), ("two_shapes.png", "图中有几个形状？")]  # if the model knows them
VIDEO_EXAMPLES = [("moving_square.mp4", "What happens in the video?")]  # a 3 s clip: Qwen-VL checkpoints with video
# a real checkpoint (no questions.json): open questions about the same pictures, not the tiny model's trained forms
GENERAL_EXAMPLES = [("three_shapes.png", "Describe this picture in detail."),
                    ("two_shapes.png", "How many shapes are there, and what colour is each one?"),
                    ("yellow_square.png", "Where in the picture is the square? Answer with its position."),
                    ("red_circle.png", "Write a one-sentence caption for this image.")]
GENERAL_ZH_EXAMPLES = [("three_shapes.png", "详细描述这张图片。"), ("two_shapes.png", "图中有几个形状？分别是什么颜色？")]


def example_sets(model_dir: str) -> tuple[bool, bool, bool, bool]:
    """Which example sets fit a model: (the tiny model's trained scenes, the same in Chinese, open questions, the
    same in Chinese). A model that ships its trained questions gets those, any other the open questions."""
    trained = trained_questions(model_dir) is not None
    return trained, knows_chinese(model_dir), not trained, not trained


def model_name(model_dir: str) -> str:
    return os.path.basename(model_dir.rstrip("/")) or model_dir


def build(holder: EngineHolder, switch: gr.Radio | None = None, engine_changed=None, demo=None):
    """Lay out the chat tab and wire its events (api names: chat, regenerate, stop); returns the chatbot (its
    history) and the system prompt box. `switch`: the header's language switch; `engine_changed` (the header's
    status line): a rebuild clears the conversation with another model, or says that another engine answered it,
    and shows the examples that fit the new model (also at `demo`'s page load)."""
    active: dict[str, str | None] = {}  # session -> request id now streaming, so Stop can abort exactly that one
    active_lock = threading.Lock()
    chatbot = gr.Chatbot(label=L("chat.history"), height=440, elem_id="chatbot")
    box = gr.MultimodalTextbox(file_types=["image", *VIDEO_EXTENSIONS], file_count="multiple", sources=["upload"], elem_id="chat-input",
                               label=L("chat.input"), show_label=False, placeholder=L("chat.placeholder"))
    with gr.Row():
        stop = gr.Button(L("chat.stop"), variant="stop", elem_id="chat-stop")
        regenerate = gr.Button(L("chat.regenerate"), elem_id="chat-regenerate")
        clear = gr.Button(L("chat.clear"))
    stats = gr.Markdown(elem_id="chat-stats", label=L("chat.stats"))
    system_prompt = gr.Textbox("", label=L("chat.system"), lines=1, elem_id="chat-system")
    with gr.Accordion(L("chat.sampling"), open=False):
        with gr.Row():
            max_tokens = gr.Slider(1, holder.config.max_model_len, value=64, step=1, label=L("chat.max_tokens"),
                                   elem_id="chat-max-tokens")
            temperature = gr.Slider(0, 2, value=0, step=0.05, label=L("chat.temperature"))
            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label=L("chat.top_p"))
            top_k = gr.Slider(0, 100, value=0, step=1, label=L("chat.top_k"))
            seed = gr.Textbox("", label=L("chat.seed"), placeholder=L("chat.seed_placeholder"), elem_id="chat-seed")
            ignore_eos = gr.Checkbox(False, label=L("chat.ignore_eos"), elem_id="chat-ignore-eos")
    json_schema, preset, parsed, parsed_line = chat_json.build()
    preset.change(chat_json.more_room, [preset, max_tokens], max_tokens, api_name=False, queue=False)
    shown = example_sets(holder.config.model)  # the sets that fit the model now; a rebuild shows others
    sets = [gr.Examples([[{"text": q, "files": [os.path.join(EXAMPLES_DIR, f)]}] for f, q in examples], inputs=[box],
                        label=L(label), visible=visible, elem_id=elem_id)
            for examples, label, visible, elem_id in zip((EXAMPLES, ZH_EXAMPLES, GENERAL_EXAMPLES, GENERAL_ZH_EXAMPLES),
                                                         ("chat.examples", "chat.examples_zh", "chat.examples_general",
                                                          "chat.examples_general_zh"), shown,
                                                         ("chat-examples", "chat-examples-zh", "chat-examples-general",
                                                          "chat-examples-general-zh"))]
    gr.Examples([[{"text": q, "files": [os.path.join(EXAMPLES_DIR, f)]}] for f, q in VIDEO_EXAMPLES], inputs=[box],
                label=L("chat.video_examples"))

    def trained_note(request: gr.Request = None, lang: str | None = None) -> str:  # at each page load: the
        trained = trained_questions(holder.config.model)  # serving model may have been rebuilt since
        if trained is None:
            return ""
        lang = lang or lang_of(request)
        about, forms = trained_summary(trained, lang)
        return t(lang, "chat.trained", about=about, questions=forms)
    trained = gr.Markdown(trained_note, elem_id="chat-trained", label=L("chat.trained_label"))

    def one_at_a_time(history, session, lang, *sampling):
        """Stream an answer to `history`, refusing a second one while this session's first still streams."""
        with active_lock:
            busy = session in active
            if not busy:
                active[session] = None
        if busy:
            raise refusal(t(lang, "chat.one_at_a_time"))
        try:
            yield from answer(history, session, lang, *sampling)
        finally:
            with active_lock:
                active.pop(session, None)

    def answer(history, session, lang, n_tokens, temp, p, k, seed_text, no_eos, system, schema):
        start = time.perf_counter()
        try:
            params = SamplingParams(max_tokens=int(n_tokens), temperature=float(temp), top_p=float(p), top_k=int(k),
                                    seed=parse_seed(seed_text, lang), ignore_eos=bool(no_eos),
                                    structured_outputs=chat_json.structured(schema, lang))
            messages = to_hf_messages(history, system)
            engine = holder.get()
        except (ValueError, RuntimeError) as e:
            yield refuse(history, e, lang)
            return
        pictured = any(part["type"] in ("image", "video") for m in messages for part in m["content"])
        note = hint(holder.config.model, pictured,
                    " ".join(part["text"] for part in messages[-1]["content"] if part["type"] == "text"), lang)
        if note and not pictured:
            history.append({"role": "assistant", "content": note, "metadata": {"title": t(lang, "chat.hint_title")}})
            yield history, None, t(lang, "chat.no_picture_line")
            return
        req = Request(messages=messages, cache_salt=holder.salt(session))
        with active_lock:
            active[session] = req.request_id
        answer_at = len(history)
        try:  # the question shows at once; the answer replaces the wait (or the paused notice) as it streams
            yield history, None, gr.skip()
            ev = None
            for update in AnswerStream(engine, req, params).updates():
                shown = history[answer_at:answer_at + 1]
                text = ev.text if ev is not None else ""
                if update is None:  # no token for a while, and the engine is paused: say why
                    paused = t(lang, "chat.paused")
                    text = f"{text}\n\n{paused}" if text else paused
                else:
                    ev = update
                    text = ev.text
                if shown:
                    shown[0]["content"] = text
                else:
                    history.append({"role": "assistant", "content": text})
                yield history, gr.skip(), gr.skip()  # the box was emptied once: what is typed meanwhile stays
        except Exception as e:  # refused input, a failed step (the app keeps serving), an engine closed by a rebuild
            chat, _, line = refuse(history[:answer_at], e, lang)  # the question stays, with the reason instead of an answer
            yield chat, gr.skip(), line
            return
        out, secs = (ev.output if ev is not None else None), time.perf_counter() - start
        if out is None:
            return
        history[answer_at] = {"role": "assistant", "content": finished_text(out.text, out.finish_reason, lang)}
        if note:  # an answer to a question the model was never trained on: a guess, and the chat says so
            history.append({"role": "assistant", "content": note, "metadata": {"title": t(lang, "chat.hint_title")}})
        n = len(out.token_ids)
        yield history, gr.skip(), t(lang, "chat.stats_line", n=n, secs=f"{secs:.2f}", rate=f"{n / max(secs, 1e-9):.1f}",
                                    prompt=out.num_prompt_tokens, cached=out.num_cached_tokens,
                                    reason=word(lang, "reason", out.finish_reason))

    # the handlers' argument names are the API's parameter names (they shadow the widgets of the same name)
    @gpu
    def respond(message, history, max_tokens, temperature, top_p, top_k, seed,
                ignore_eos, system_prompt, json_schema, request: gr.Request):
        history = list(history or [])
        turn = user_turn(message or {})
        if not turn["content"]:
            gr.Warning(t(lang_of(request), "chat.type_first"))
            yield history, gr.skip(), gr.skip()
            return
        history.append(turn)
        yield from one_at_a_time(history, request.session_hash if request else None, lang_of(request), max_tokens,
                                 temperature, top_p, top_k, seed, ignore_eos,
                                 system_prompt, json_schema)

    @gpu
    def regenerate_last(history, max_tokens, temperature, top_p, top_k, seed,
                        ignore_eos, system_prompt, json_schema, request: gr.Request):
        history = list(history or [])
        while history and history[-1]["role"] != "user":  # the last answer (or its error bubble) goes
            history.pop()
        if not history:
            raise refusal(t(lang_of(request), "chat.nothing_to_regenerate"))
        for chat, _, line in one_at_a_time(history, request.session_hash if request else None, lang_of(request),
                                           max_tokens,
                                           temperature, top_p, top_k, seed,
                                           ignore_eos, system_prompt, json_schema):
            yield chat, gr.skip(), line  # whatever is typed in the box stays there

    def stop_request(request: gr.Request):
        with active_lock:
            rid = active.get(request.session_hash if request else None)
        if rid is not None:
            holder.get().abort(rid)

    def show_parsed(history, json_schema, request: gr.Request):
        return chat_json.parsed(history or [], json_schema, lang_of(request))

    served = gr.State(None)  # (engine build, model) that answered this page's conversation

    def answered_by():
        return holder.builds, holder.config.model

    def after_rebuild(history, line, by, request: gr.Request):
        """The header rebuilt the engine: another model's conversation goes (with a line that says so); the same
        model's stays, and the line says the next answer computes it again. The examples follow the model."""
        examples = [gr.Dataset(visible=v) for v in example_sets(holder.config.model)]
        if not history or by is None or by[0] == holder.builds:  # an empty chat keeps no note of an older rebuild
            stale = not history and (line or "").startswith(REBUILT_MARK)
            return gr.skip(), "" if stale else gr.skip(), gr.skip(), *examples
        lang, model = lang_of(request), holder.config.model
        if by[1] != model:
            return [], t(lang, "chat.cleared_for_model", model=model_name(model), old=model_name(by[1])), None, \
                *examples
        return gr.skip(), t(lang, "chat.rebuilt_note", model=model_name(model)), answered_by(), *examples

    rebuilt_outputs = [chatbot, stats, served, *[examples.dataset for examples in sets]]
    if engine_changed is not None:
        engine_changed.change(after_rebuild, [chatbot, stats, served], rebuilt_outputs, api_name=False, queue=False,
                              show_progress="hidden")
    if demo is not None:
        demo.load(after_rebuild, [chatbot, stats, served], rebuilt_outputs, api_name=False, queue=False,
                  show_progress="hidden")

    sampling = [max_tokens, temperature, top_p, top_k, seed, ignore_eos, system_prompt, json_schema]
    # "multiple": a second Enter while an answer streams reaches the server and is refused out loud (gradio's
    # default, "once", drops it without a word)
    box.submit(respond, [box, chatbot, *sampling], [chatbot, box, stats], api_name="chat", concurrency_id="chat",
               trigger_mode="multiple",
               concurrency_limit=holder.config.max_num_seqs,
               api_description="Ask: a message (text and images) after the chat history; streams the answer.").then(
        show_parsed, [chatbot, json_schema], [parsed, parsed_line], api_name=False, queue=False).then(
        answered_by, None, served, api_name=False, queue=False)
    regenerate.click(regenerate_last, [chatbot, *sampling], [chatbot, box, stats], api_name="regenerate",
                     concurrency_id="chat", api_description="Answer the last question of the history again.").then(
        show_parsed, [chatbot, json_schema], [parsed, parsed_line], api_name=False, queue=False).then(
        answered_by, None, served, api_name=False, queue=False)
    stop.click(stop_request, None, None, api_name="stop", queue=False,
               api_description="Stop this session's answer that is streaming now.")
    clear.click(lambda: ([], None, "", None, "", None), None, [chatbot, box, stats, parsed, parsed_line, served],
                api_name=False, queue=False)
    if switch is not None:  # the trained questions' note in the chosen language
        def relang(chosen, request: gr.Request):
            LANGUAGES.set(request, chosen)
            return trained_note(lang=chosen)
        switch.change(relang, switch, trained, api_name=False, queue=False)
    return chatbot, system_prompt

