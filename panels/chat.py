"""Chat tab: image + text in, the answer streams out token by token; multi-turn, stop, sampling controls."""
import itertools
import os
import threading
import time

import gradio as gr

from minivlm import Request, SamplingParams

from panels.access import refusal
from panels.holder import EXAMPLES_DIR, EngineHolder, gpu

ERROR_TITLE = "⚠️ request refused"
EXAMPLES = [("red_circle.png", "Describe the picture."), ("blue_circle.png", "What color is the shape?"),
            ("green_triangle.png", "What shape is it?"), ("yellow_square.png", "Where is the yellow square?"),
            ("two_shapes.png", "Describe the picture."), ("three_shapes.png", "Describe the picture."),
            ("three_shapes.png", "Where is the green circle?"), ("two_shapes.png", "How many shapes are there?")]


def _parts(content) -> list:
    return content if isinstance(content, list) else [content]


def to_hf_messages(history: list[dict], system_prompt: str = "") -> list[dict]:
    """Gradio chat history -> HF messages (images as file paths), after the system prompt if one is given; a
    refused turn and its error bubble are dropped."""
    kept = []
    for m in history:
        if (m.get("metadata") or {}).get("title") == ERROR_TITLE:
            if kept and kept[-1]["role"] == "user":
                kept.pop()
            continue
        kept.append(m)
    system = (system_prompt or "").strip()
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    for m in kept:
        content = []
        for part in _parts(m["content"]):
            if isinstance(part, str):
                content.append({"type": "text", "text": part})
            elif part.get("type") == "text":
                content.append({"type": "text", "text": part["text"]})
            elif part.get("type") == "file" or "path" in part:  # normalized by gradio, or as user_turn made it
                content.append({"type": "image", "image": (part.get("file") or part)["path"]})
        if messages and messages[-1]["role"] == m["role"]:  # gradio may split one turn into several bubbles
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": m["role"], "content": content})
    return messages


def user_turn(message: dict) -> dict:
    """A MultimodalTextbox value as one user chat message (images first, as the engine's prompts put them)."""
    files = [{"path": f if isinstance(f, str) else f["path"]} for f in message.get("files") or []]
    text = (message.get("text") or "").strip()
    return {"role": "user", "content": files + ([{"type": "text", "text": text}] if text else [])}


def turn_files(turn: dict) -> list[str]:
    """The file paths of one chat message (as user_turn or gradio wrote them)."""
    return [(part.get("file") or part)["path"] for part in _parts(turn["content"])
            if isinstance(part, dict) and (part.get("type") == "file" or "path" in part)]


def refuse(history: list[dict], error: Exception):
    """The chat outputs for a request the engine refused or failed: the reason once, in an error bubble, with each
    uploaded file called by its own name (never the server's temporary path)."""
    message = str(error)
    for m in history:
        if m["role"] == "user":
            for path in turn_files(m):
                message = message.replace(path, os.path.basename(path))
    history.append({"role": "assistant", "content": message, "metadata": {"title": ERROR_TITLE}})
    return history, None, "refused (the reason is in the chat)"


def parse_seed(text) -> int | None:
    """The seed box: empty = the engine's seed, else a whole number."""
    text = "" if text is None else str(text).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise refusal(f"The seed must be a whole number or empty (the engine's), not {text!r}.") from None


def finished_text(text: str, finish_reason: str) -> str:
    """What the answer bubble shows once the answer is complete: an empty answer says so."""
    return text if text.strip() else f"(empty answer · finish: {finish_reason})"


def build(holder: EngineHolder):
    """Lay out the chat tab and wire its events (api names: chat, regenerate, stop); returns the chatbot (its
    history)."""
    active: dict[str, str | None] = {}  # session -> request id now streaming, so Stop can abort exactly that one
    active_lock = threading.Lock()
    chatbot = gr.Chatbot(label="chat history", height=440, elem_id="chatbot")
    box = gr.MultimodalTextbox(file_types=["image"], file_count="multiple", sources=["upload"], elem_id="chat-input",
                               label="message (text and images)", show_label=False,
                               placeholder="Attach an image and ask about it, e.g. Describe the picture.")
    with gr.Row():
        stop = gr.Button("Stop", variant="stop", elem_id="chat-stop")
        regenerate = gr.Button("Regenerate", elem_id="chat-regenerate")
        clear = gr.Button("Clear chat")
    stats = gr.Markdown(elem_id="chat-stats", label="answer statistics")
    system_prompt = gr.Textbox("", label="system prompt (sent before the conversation; empty = none)", lines=1,
                               elem_id="chat-system")
    with gr.Accordion("Sampling", open=False):
        with gr.Row():
            max_tokens = gr.Slider(1, holder.config.max_model_len, value=64, step=1, label="max tokens")
            temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
            top_k = gr.Slider(0, 100, value=0, step=1, label="top-k (0 = off)")
            seed = gr.Textbox("", label="seed (empty = engine's)", placeholder="engine's seed", elem_id="chat-seed")
            ignore_eos = gr.Checkbox(False, label="ignore EOS (keep decoding to max tokens)")
    gr.Examples([[{"text": q, "files": [os.path.join(EXAMPLES_DIR, f)]}] for f, q in EXAMPLES], inputs=[box],
                label="Example scenes (the tiny model was trained on such scenes)")

    def one_at_a_time(history, session, *sampling):
        """Stream an answer to `history`, refusing a second one while this session's first still streams."""
        with active_lock:
            busy = session in active
            if not busy:
                active[session] = None
        if busy:
            raise refusal("One answer at a time per session: wait for the current one to finish, or press Stop.")
        try:
            yield from answer(history, session, *sampling)
        finally:
            with active_lock:
                active.pop(session, None)

    def answer(history, session, n_tokens, temp, p, k, seed_text, no_eos, system):
        start = time.perf_counter()
        try:
            params = SamplingParams(max_tokens=int(n_tokens), temperature=float(temp), top_p=float(p), top_k=int(k),
                                    seed=parse_seed(seed_text), ignore_eos=bool(no_eos))
            req = Request(messages=to_hf_messages(history, system), cache_salt=holder.salt(session))
            stream = holder.get().stream(req, params, snapshots=False)
            first = next(stream)  # the engine validates the request here: bad input raises ValueError
        except (ValueError, RuntimeError) as e:  # RuntimeError: the engine was closed by a rebuild meanwhile
            yield refuse(history, e)
            return
        with active_lock:
            active[session] = req.request_id
        history.append({"role": "assistant", "content": ""})
        ev = first
        try:
            for ev in itertools.chain([first], stream):
                history[-1]["content"] = ev.text
                yield history, None, gr.skip()
        except Exception as e:  # a failed engine step (e.g. out of memory) ends this request, not the app
            yield refuse(history[:-1], e)
            return
        finally:
            stream.close()  # if the page went away mid-answer, this aborts the request in the engine
        out, secs = ev.output, time.perf_counter() - start
        if out is None:
            return
        history[-1]["content"] = finished_text(out.text, out.finish_reason)
        n = len(out.token_ids)
        yield history, None, (f"{n} tokens in {secs:.2f} s ({n / max(secs, 1e-9):.1f} tok/s) · prompt "
                              f"{out.num_prompt_tokens} tokens, {out.num_cached_tokens} from the prefix cache · "
                              f"finish: {out.finish_reason}")

    # the handlers' argument names are the API's parameter names (they shadow the widgets of the same name)
    @gpu
    def respond(message, history, max_tokens, temperature, top_p, top_k, seed,
                ignore_eos, system_prompt, request: gr.Request):
        history = list(history or [])
        turn = user_turn(message or {})
        if not turn["content"]:
            gr.Warning("Type a question or attach an image first.")
            yield history, gr.skip(), gr.skip()
            return
        history.append(turn)
        yield from one_at_a_time(history, request.session_hash if request else None, max_tokens,
                                 temperature, top_p, top_k, seed, ignore_eos,
                                 system_prompt)

    @gpu
    def regenerate_last(history, max_tokens, temperature, top_p, top_k, seed,
                        ignore_eos, system_prompt, request: gr.Request):
        history = list(history or [])
        while history and history[-1]["role"] != "user":  # the last answer (or its error bubble) goes
            history.pop()
        if not history:
            raise refusal("Nothing to regenerate yet: ask a question first.")
        for chat, _, line in one_at_a_time(history, request.session_hash if request else None, max_tokens,
                                           temperature, top_p, top_k, seed,
                                           ignore_eos, system_prompt):
            yield chat, gr.skip(), line  # whatever is typed in the box stays there

    def stop_request(request: gr.Request):
        with active_lock:
            rid = active.get(request.session_hash if request else None)
        if rid is not None:
            holder.get().abort(rid)

    sampling = [max_tokens, temperature, top_p, top_k, seed, ignore_eos, system_prompt]
    box.submit(respond, [box, chatbot, *sampling], [chatbot, box, stats], api_name="chat", concurrency_id="chat",
               concurrency_limit=holder.config.max_num_seqs,
               api_description="Ask: a message (text and images) after the chat history; streams the answer.")
    regenerate.click(regenerate_last, [chatbot, *sampling], [chatbot, box, stats], api_name="regenerate",
                     concurrency_id="chat", api_description="Answer the last question of the history again.")
    stop.click(stop_request, None, None, api_name="stop", queue=False,
               api_description="Stop this session's answer that is streaming now.")
    clear.click(lambda: ([], None, ""), None, [chatbot, box, stats], api_name=False, queue=False)
    return chatbot

