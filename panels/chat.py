"""Chat tab: image + text in, the answer streams out token by token; multi-turn, stop, sampling controls."""
import itertools
import os
import threading
import time

import gradio as gr

from minivlm import Request, SamplingParams

from panels.holder import EXAMPLES_DIR, EngineHolder, gpu

ERROR_TITLE = "⚠️ request refused"
EXAMPLES = [("red_circle.png", "What color is the shape?"), ("blue_circle.png", "What color is the shape?"),
            ("green_triangle.png", "What shape is it?"), ("yellow_square.png", "What shape is it?"),
            ("two_shapes.png", "How many shapes are there?"), ("three_shapes.png", "What color is the triangle?")]


def _parts(content) -> list:
    return content if isinstance(content, list) else [content]


def to_hf_messages(history: list[dict]) -> list[dict]:
    """Gradio chat history -> HF messages (images as file paths); a refused turn and its error bubble are dropped."""
    kept = []
    for m in history:
        if (m.get("metadata") or {}).get("title") == ERROR_TITLE:
            if kept and kept[-1]["role"] == "user":
                kept.pop()
            continue
        kept.append(m)
    messages = []
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


def refuse(history: list[dict], error: Exception):
    """The chat outputs for a request the engine refused or failed: a warning and an error bubble."""
    gr.Warning(str(error))
    history.append({"role": "assistant", "content": str(error), "metadata": {"title": ERROR_TITLE}})
    return history, None, f"refused: {error}"


def build(holder: EngineHolder):
    """Lay out the chat tab and wire its events (api names: chat, stop); returns the chatbot (its history)."""
    active: dict[str, str] = {}  # session -> request id now streaming, so Stop can abort exactly that one
    active_lock = threading.Lock()
    chatbot = gr.Chatbot(label="minivlm", height=440, elem_id="chatbot")
    box = gr.MultimodalTextbox(file_types=["image"], file_count="multiple", sources=["upload"], elem_id="chat-input",
                               show_label=False,
                               placeholder="Attach an image and ask about it, e.g. What color is the shape?")
    with gr.Row():
        stop = gr.Button("Stop", variant="stop", elem_id="chat-stop")
        clear = gr.Button("Clear chat")
    stats = gr.Markdown(elem_id="chat-stats")
    with gr.Accordion("Sampling", open=False):
        with gr.Row():
            max_tokens = gr.Slider(1, holder.config.max_model_len, value=64, step=1, label="max tokens")
            temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
            top_k = gr.Slider(0, 100, value=0, step=1, label="top-k (0 = off)")
            seed = gr.Number(None, label="seed (empty = engine's)", precision=0)
            ignore_eos = gr.Checkbox(False, label="ignore EOS (keep decoding to max tokens)")
    gr.Examples([[{"text": q, "files": [os.path.join(EXAMPLES_DIR, f)]}] for f, q in EXAMPLES], inputs=[box],
                label="Example scenes (the tiny model was trained on such scenes)")

    @gpu
    def respond(message, history, n_tokens, temp, p, k, seed_value, no_eos, request: gr.Request):
        history = list(history or [])
        turn = user_turn(message or {})
        if not turn["content"]:
            gr.Warning("Type a question or attach an image first.")
            yield history, gr.skip(), gr.skip()
            return
        history.append(turn)
        session = request.session_hash if request else None
        start = time.perf_counter()
        try:
            params = SamplingParams(max_tokens=int(n_tokens), temperature=float(temp), top_p=float(p), top_k=int(k),
                                    seed=None if seed_value is None else int(seed_value), ignore_eos=bool(no_eos))
            req = Request(messages=to_hf_messages(history), cache_salt=holder.salt(session))
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
            with active_lock:
                active.pop(session, None)
        out, secs = ev.output, time.perf_counter() - start
        n = len(out.token_ids) if out else 0
        yield history, None, (f"{n} tokens in {secs:.2f} s ({n / max(secs, 1e-9):.1f} tok/s) · prompt "
                              f"{out.num_prompt_tokens} tokens, {out.num_cached_tokens} from the prefix cache · "
                              f"finish: {out.finish_reason}" if out else "")

    def stop_request(request: gr.Request):
        with active_lock:
            rid = active.get(request.session_hash if request else None)
        if rid is not None:
            holder.get().abort(rid)

    inputs = [box, chatbot, max_tokens, temperature, top_p, top_k, seed, ignore_eos]
    box.submit(respond, inputs, [chatbot, box, stats], api_name="chat", concurrency_id="chat",
               concurrency_limit=holder.config.max_num_seqs)
    stop.click(stop_request, None, None, api_name="stop", queue=False)
    clear.click(lambda: ([], None, ""), None, [chatbot, box, stats], api_name=False, queue=False)
    return chatbot

