"""How the app says no: a user's mistake or a refused call becomes a message on the page (and in the API
client's exception), never a traceback in the server log."""
import gradio as gr


def refusal(message: str) -> gr.Error:
    """A gr.Error for something the caller asked for and may not or cannot have (no traceback: not a server bug)."""
    return gr.Error(message, print_exception=False)
