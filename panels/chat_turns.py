"""A conversation as the engine reads it (the chat tab's handlers use these): gradio's history -> HF messages, a user
turn from the input box, the files of a turn, a refused turn's error bubble, the seed box, the finished answer."""
import os

from panels.access import refusal
from panels.chat_hints import HINT_TITLES
from panels.i18n import CATALOGUE, EN, t, word
from panels.i18n.errors import localize_error

ERROR_TITLES = CATALOGUE["chat.error_title"]  # a bubble keeps the language it was written in


def _parts(content) -> list:
    return content if isinstance(content, list) else [content]


VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".avi")  # sent as videos (a GIF stays an image: its first frame)


def to_hf_messages(history: list[dict], system_prompt: str = "") -> list[dict]:
    """Gradio chat history -> HF messages (images as file paths), after the system prompt if one is given; a
    refused turn and its error bubble are dropped."""
    kept = []
    for m in history:
        title = (m.get("metadata") or {}).get("title")
        if title in (*ERROR_TITLES, *HINT_TITLES):  # a refused (or picture-less) question goes with its bubble
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
                path = (part.get("file") or part)["path"]
                kind = "video" if path.lower().endswith(VIDEO_EXTENSIONS) else "image"
                content.append({"type": kind, kind: path})
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


def refuse(history: list[dict], error: Exception, lang: str = EN):
    """The chat outputs for a request the engine refused or failed: the reason once, in an error bubble, with each
    uploaded file called by its own name (never the server's temporary path), in the page's language."""
    message = localize_error(error, lang)
    for m in history:
        if m["role"] == "user":
            for path in turn_files(m):
                message = message.replace(path, os.path.basename(path))
    history.append({"role": "assistant", "content": message,
                    "metadata": {"title": t(lang, "chat.error_title")}})
    return history, None, t(lang, "chat.refused_line")


def parse_seed(text, lang: str = EN) -> int | None:
    """The seed box: empty = the engine's seed, else a whole number."""
    text = "" if text is None else str(text).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise refusal(t(lang, "chat.bad_seed", text=text[:40])) from None


def finished_text(text: str, finish_reason: str, lang: str = EN) -> str:
    """What the answer bubble shows once the answer is complete: an empty answer says so."""
    return text if text.strip() else t(lang, "chat.empty_answer", reason=word(lang, "reason", finish_reason))
