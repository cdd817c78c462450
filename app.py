"""minivlm demo app: composition only. Parse args, build one engine, lay out the tabs from panels/, launch."""
import argparse
import logging
import os
import sys

import gradio as gr

from panels.holder import EXAMPLES_DIR, OPERATOR_TOKEN_ENV, EngineHolder  # first: imports `spaces` before torch
from panels import anatomy, cache_inspector, chat, header, kv_blocks, kv_watch, page, sessions, vram
from panels import request_timeline, roofline
from panels.i18n import EN, I18N, LANGUAGES, L, SWITCH_CHOICES, english_api, lang_of, static_texts, static_updates
from minivlm import EngineConfig, available_devices
from minivlm.api import ApiSettings, create_router
from minivlm.inputs.image_limits import MAX_IMAGE_BYTES
from minivlm.config import DEVICES, DTYPES, STRATEGIES
from minivlm.device import cpu_fallback_warning

QUEUE_MAX_SIZE = 64  # beyond this many waiting events the page says the app is busy
MAX_FILE_SIZE = MAX_IMAGE_BYTES  # uploads above this are refused (HTTP 413) before they reach the disk's cache: the
# engine's own limit per image, the same as the HTTP API's
UPLOAD_TTL_S = 3600  # uploaded and generated temp files older than this are deleted (checked as often)
TINY_MODEL_BLOCKS = 256  # the tiny model's pool is pinned small so the block map stays readable and fills up


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="minivlm: a paged-KV Qwen-VL engine with a teaching UI")
    p.add_argument("--model", default=EngineConfig().model, help="local HF checkpoint dir or hub id (default: tiny)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto = cuda > mps > cpu, except that the shipped tiny model skips mps (less tested)")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--strategy", default="C", choices=STRATEGIES, help="prefix-cache strategy")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None,
                   help=f"pin the KV pool size (default: {TINY_MODEL_BLOCKS} for the tiny model, else from memory; "
                        "0 = from memory)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--enable-chunked-prefill", action="store_true",
                   help="split long prefills into chunks that share each step with the running requests' decodes")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens one step may compute (default: the model length; with chunked prefill at most 512, "
                        "sized each step by --max-step-slowdown unless this pins it)")
    p.add_argument("--max-step-slowdown", type=float, default=None,
                   help="chunked prefill: a step with a prefill chunk may take this many times a decode-only step, "
                        "measured as it runs (default 1.5 when no token budget is pinned)")
    p.add_argument("--async-vision", action="store_true",
                   help="run the vision tower on its own thread so running streams never stall on a new image "
                        "(with chunked prefill: in time slices lent between steps; serving; step numbers then depend "
                        "on timing, so classroom step-through keeps it off)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vLLM's switch: decode layer by layer in PyTorch ops, without the fused C paths (comparisons)")
    p.add_argument("--shared", action="store_true",
                   help="public deployment (automatic on Hugging Face Spaces): strategy C, a cache salt per session, "
                        "the engine settings read-only for visitors (the operator unlocks them with "
                        f"${OPERATOR_TOKEN_ENV})")
    p.add_argument("--max-file-size", default=MAX_FILE_SIZE, help=f"largest accepted upload, e.g. 10mb, 500kb (default {MAX_IMAGE_BYTES // 2**20} MiB, the "
                        "engine's limit per image)")
    p.add_argument("--upload-ttl", type=int, default=UPLOAD_TTL_S,
                   help="seconds after which uploaded and generated temp files are deleted")
    p.add_argument("--kv-events-config", default=None, metavar="JSON",
                   help="publish KV-cache events as vLLM does, e.g. '{\"enable_kv_cache_events\": true, "
                        "\"publisher\": \"zmq\", \"topic\": \"kv-events\"}' (docs/KV_EVENTS.md)")
    p.add_argument("--quantization", default=None, choices=["int8", "int4"],
                   help="weight-only quantization of the decoder's linear layers (CPU, PyTorch's int8 / int4 kernels)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="speculative decoding as vLLM takes it, e.g. '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1}'")
    p.add_argument("--watch-kv-events", default=None, metavar="tcp://host:port[#topic]",
                   help="draw the prefix tree of an external KV-event publisher (vLLM, SGLang, minivlm) in the KV tab")
    p.add_argument("--watch-kv-replay", default=None, metavar="tcp://host:port",
                   help="that publisher's replay endpoint, to recover batches the watcher missed")
    p.add_argument("--verbose", action="store_true", help="log every engine built (also the isolated pools)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    p.add_argument("--api-key", action="append", default=None,
                   help="Bearer key the HTTP API (/v1) requires; repeatable (default: $MINIVLM_API_KEY). On a shared "
                        "deployment the API is off without one")
    p.add_argument("--allowed-media-domains", nargs="*", default=[],
                   help="domains the API may fetch http(s) image URLs from (default: none, data: URLs only)")
    return p.parse_args(argv)


def build_app(holder: EngineHolder, upload_ttl: int = UPLOAD_TTL_S,
              watching: kv_watch.Watching | None = None) -> gr.Blocks:
    """The whole UI around one engine holder; temp files older than `upload_ttl` seconds are deleted; `watching`:
    the external KV-event stream the KV tab draws (--watch-kv-events)."""
    with gr.Blocks(title="minivlm", delete_cache=(upload_ttl, upload_ttl)) as demo:
        with gr.Row(equal_height=True):
            gr.Markdown(L("app.title"), elem_id="app-title")
            # the page's language: the browser's at first, then this switch (each name in its own language)
            switch = gr.Radio(SWITCH_CHOICES, value=EN, label=L("app.language"), elem_id="lang-switch", scale=0,
                              min_width=170)
        status = header.build(holder, demo, switch)
        with gr.Tabs(overflow_behavior="wrap", elem_id="tabs"):  # on a phone a second row, never a "…" menu
            with gr.Tab(L("tab.chat"), id="chat"):
                chatbot, system = chat.build(holder, switch, engine_changed=status, demo=demo)
            with gr.Tab(L("tab.anatomy"), id="anatomy") as anatomy_tab:
                anatomy.build(holder, anatomy_tab, chatbot, demo, engine_changed=status,  # its sliders follow the model
                              system=system)
            with gr.Tab(L("tab.kv"), id="kv"):
                kv_blocks.build(holder, switch)
                kv_watch.build(watching or kv_watch.Watching(), holder.shared)
            with gr.Tab(L("tab.inspector"), id="inspector"):
                cache_inspector.build(holder)
            with gr.Tab(L("tab.vram"), id="vram"):
                calculate, inputs, outputs = vram.build(holder, switch)
            with gr.Tab(L("tab.timeline"), id="timeline"):
                request_timeline.build(holder, switch)
            with gr.Tab(L("tab.roofline"), id="roofline"): roofline.build(holder, switch)  # noqa: E701
        demo.load(calculate, inputs, outputs, api_name=False, show_progress="hidden")
        texts = static_texts(demo)

        def relabel(chosen, request: gr.Request):  # every static text of the page in the chosen language
            LANGUAGES.set(request, chosen)
            return static_updates(texts, chosen)
        switch.change(relabel, switch, [block for block, _ in texts], api_name=False, queue=False,
                      js=page.SWITCH_JS)
        def session_language(request: gr.Request):  # the browser's, or what the session chose
            return lang_of(request)
        # the session's language on the switch; a change redraws the page in it
        demo.load(session_language, None, switch, api_name=False, queue=False)
    # the engine batches concurrent requests itself; the bound turns overload into a "busy" message
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=holder.config.max_num_seqs)
    holder.sessions.watch(demo)  # what an idle session holds is released (panels/sessions.py)
    return english_api(demo)


def serve(holder: EngineHolder, host: str = "127.0.0.1", port: int = 7860, share: bool = False,
          block: bool = True, api: ApiSettings | None = None, max_file_size: str | int = MAX_FILE_SIZE,
          upload_ttl: int = UPLOAD_TTL_S, watching: kv_watch.Watching | None = None) -> gr.Blocks:
    """Build the UI and serve it with the HTTP API (/v1, /metrics) on the same port (block=False returns at once,
    for tests). The API always uses the holder's current engine."""
    demo = build_app(holder, upload_ttl, watching)
    api_routes = create_router(holder.get, api or ApiSettings(shared=holder.shared)).routes
    # quiet: Gradio's own start-up lines say "set `share=True` in `launch()`"; the app says its own, with its flags
    demo.launch(server_name=host, server_port=port, share=share, css=page.CSS, js=page.JS, allowed_paths=[EXAMPLES_DIR],
                i18n=I18N,
                theme=page.THEME, prevent_thread_lock=True, quiet=True, max_file_size=max_file_size,
                state_session_capacity=sessions.SESSIONS_KEPT,  # gradio's page state: 256 sessions, not 10,000
                app_kwargs={"routes": api_routes})  # Gradio's FastAPI app starts with the API's routes
    if block:
        print(f"* Running on local URL:  {demo.local_url}", flush=True)
        print(f"* Running on public URL: {demo.share_url}" if share and demo.share_url else
              "* Could not create a public link (see above)" if share else
              "* To create a public link, start the app with --share.", flush=True)
        demo.block_thread()
    return demo


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine settings the command line asks for (the tiny model gets its small fixed pool by default)."""
    num_blocks = args.num_blocks if args.num_blocks is not None else \
        TINY_MODEL_BLOCKS if args.model == EngineConfig().model else 0
    return EngineConfig(model=args.model, device=args.device, dtype=args.dtype, cache_strategy=args.strategy,
                        block_size=args.block_size, num_blocks=num_blocks or None, max_model_len=args.max_model_len,
                        enable_chunked_prefill=args.enable_chunked_prefill,
                        max_num_batched_tokens=args.max_num_batched_tokens, async_vision=args.async_vision,
                        max_step_slowdown=args.max_step_slowdown, enforce_eager=args.enforce_eager,
                        kv_events=args.kv_events_config, speculative_config=args.speculative_config,
                        quantization=args.quantization)


def fail(message: str, code: int = 2):
    """Stop the app before it serves: one line on stderr saying what is wrong and what to do (no traceback)."""
    print(f"minivlm: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def device_problem(device: str) -> str | None:
    """Why the --device asked for cannot run here, with what to do instead (None: it can)."""
    why = available_devices().get(device) if device != "auto" else None
    return None if why is None else f"--device {device} is not available here ({why}); start with --device auto " \
                                    "(it picks the best device there is) or --device cpu"


def auto_fallback(args: argparse.Namespace, holder: EngineHolder) -> str | None:
    """The warning for --device auto landing on the CPU with weights big enough to make it slow (the rule and its
    threshold: minivlm/device.py), else None."""
    engine = holder.engine
    if args.device != "auto" or engine is None:
        return None
    report = engine.memory_report()
    return cpu_fallback_warning(report.device, report.weights_bytes)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(format="%(message)s")
    # the engine's vLLM-style start-up line per engine (one per isolated pool, too) only when asked for
    logging.getLogger("minivlm").setLevel(logging.INFO if args.verbose else logging.WARNING)
    if (problem := device_problem(args.device)) is not None:
        fail(problem)
    watching = kv_watch.Watching()
    try:
        config = engine_config(args)  # a bad --kv-events-config stops here with the field that is wrong
        if args.watch_kv_events:
            watching.start(args.watch_kv_events, args.watch_kv_replay)
    except ValueError as e:
        fail(e)
    shared = args.shared or bool(os.environ.get("SPACE_ID"))
    if shared:  # many sessions' threads: two heap arenas, not 16 (panels/sessions.py)
        sessions.limit_malloc_arenas()
    holder = EngineHolder(config, shared=shared,
                          operator_token=os.environ.get(OPERATOR_TOKEN_ENV))
    try:
        status = holder.load()
    except (ValueError, OSError) as e:  # a missing, incomplete or corrupt checkpoint; a device that failed
        fail(f"{e} (--model {args.model})" if args.model not in str(e) else e)
    if (warning := auto_fallback(args, holder)) is not None:
        print(warning, file=sys.stderr, flush=True)
    print(status, flush=True)
    keys = args.api_key or [k for k in os.environ.get("MINIVLM_API_KEY", "").split(",") if k]
    api = ApiSettings(keys, holder.shared, [d.lower() for d in args.allowed_media_domains])
    print(f"HTTP API at /v1 (OpenAI format) and /metrics: {'key required' if keys else 'no key'}" if api.enabled
          else "HTTP API off (a shared deployment needs --api-key or MINIVLM_API_KEY)", flush=True)
    if config.kv_events is not None and config.kv_events.active:
        print(f"KV events: publishing on {config.kv_events.endpoint}"
              + (f", replay on {config.kv_events.replay_endpoint}" if config.kv_events.replay_endpoint else ""),
              flush=True)
    try:
        serve(holder, args.host, args.port, args.share, api=api, max_file_size=args.max_file_size,
              upload_ttl=args.upload_ttl, watching=watching)
    except OSError as e:  # the port is taken, the host is not this machine's
        fail(f"cannot serve on {args.host}:{args.port}: {str(e).split('. ')[0]}; choose another with --port or --host")


if __name__ == "__main__":
    main()
