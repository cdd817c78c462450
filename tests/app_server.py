"""Start the real app (python app.py ...) on a free port for the client and browser tests, and stop it after."""
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP_MODEL = os.environ.get("MINIVLM_APP_MODEL")  # default: the app's own default, the shipped tiny model
# the session's public deployment (tests/conftest.py's shared_app_process): its pool, operator token and API keys
SHARED_NUM_BLOCKS = 128
SHARED_ADMIN_TOKEN = "operator-secret-for-tests"
SHARED_API_KEYS = "class-key,teacher-key"


class AppUrl(str):
    """The app's URL, knowing the server process's pid (to read its memory in /proc)."""
    pid: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_args() -> list[str]:
    """--model for the app under test (the shipped tiny model unless MINIVLM_APP_MODEL names another)."""
    return ["--model", APP_MODEL] if APP_MODEL else []


@contextlib.contextmanager
def running_app(*args: str, log_path: str, timeout: float = 240, env: dict | None = None):
    """Run app.py with `args` (port via GRADIO_SERVER_PORT, as on Spaces) and extra `env`; yields its URL (with
    the process's .pid) once it serves."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
           "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("SPACE_ID", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "app.py", "--device", "cpu", *model_args(), *args], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    url = AppUrl(f"http://127.0.0.1:{port}/")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app exited with {proc.returncode}:\n{open(log_path).read()[-3000:]}")
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"app did not serve within {timeout} s:\n{open(log_path).read()[-3000:]}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def app_in_process(num_blocks: int, shared: bool = False, operator_token: str | None = None, model: str | None = None,
                   quantization: str | None = None):
    """The app served from this process on a free port, so a test reads the same engine the page shows:
    yields (holder, url). shared=True: as `python app.py --shared` (read-only header, per-session KV runs);
    operator_token: as if $MINIVLM_ADMIN_TOKEN were set; model: a checkpoint dir other than the tiny model;
    quantization: as `--quantization`."""
    import app as app_module
    from minivlm import EngineConfig
    from panels.holder import EngineHolder
    holder = EngineHolder(EngineConfig(model=model or APP_MODEL or EngineConfig().model, device="cpu",
                                       num_blocks=num_blocks, quantization=quantization),
                          shared=shared, operator_token=operator_token)
    holder.load()
    port = free_port()
    demo = app_module.serve(holder, port=port, block=False)
    try:
        yield holder, f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
        holder.engine.close()


def keep_shot(target, shots: str, name: str, **options):
    """A screenshot of `target` (a page or a locator) for people to look at, as shots/name: taken only when
    $MINIVLM_SCREENSHOTS asks for them (docs/screenshots to refresh the README's). No test reads these files, and a
    full page costs seconds on 2 cores, so the default run draws none; the checks that read pixels take their own."""
    if os.environ.get("MINIVLM_SCREENSHOTS"):
        target.screenshot(path=os.path.join(shots, name), **options)


_PLAYWRIGHT: list = []  # the session's one Playwright driver, started on first use
_BROWSERS: dict = {}  # (chromium, args) -> its browser, launched once for the whole test session


def shared_browser(chromium: str, args: list[str]):
    """One headless chromium (Playwright driving Debian's browser) for every browser test of the session: launching
    one costs seconds on 2 cores. Pages get contexts of their own (cookies, storage, locale), so they share nothing
    else; close_browsers() (tests/conftest.py, at the session's end) closes it."""
    key = (chromium, tuple(args))
    browser = _BROWSERS.get(key)
    if browser is None or not browser.is_connected():
        if not os.path.exists(chromium):
            raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
        if not _PLAYWRIGHT:
            from playwright.sync_api import sync_playwright
            _PLAYWRIGHT.append(sync_playwright().start())
        browser = _BROWSERS[key] = _PLAYWRIGHT[0].chromium.launch(executable_path=chromium, args=args, headless=True)
    return browser


def close_browsers():
    """Close the session's browsers and stop Playwright (nothing to do when no test opened a page)."""
    for browser in _BROWSERS.values():
        with contextlib.suppress(Exception):
            browser.close()
    _BROWSERS.clear()
    if _PLAYWRIGHT:
        with contextlib.suppress(Exception):
            _PLAYWRIGHT.pop().stop()


@contextlib.contextmanager
def browser_page(url: str, chromium: str, args: list[str], timeout_ms: int, height: int = 1000, **context):
    """A page of the session's headless chromium, in a context of its own (`context`: Playwright's new_context
    arguments, e.g. locale), opened on the app at `url`. On exit it closes every context opened since it started
    (other pages a test opened from it), so none is left polling a server."""
    browser = shared_browser(chromium, args)
    before = list(browser.contexts)
    page = browser.new_context(viewport={"width": 1400, "height": height}, **context).new_page()
    try:
        page.set_default_timeout(timeout_ms)
        page.goto(url)
        page.wait_for_selector("#chatbot")
        yield page
    finally:
        for ctx in browser.contexts:
            if not any(ctx is b for b in before):
                with contextlib.suppress(Exception):
                    ctx.close()
