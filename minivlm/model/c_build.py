"""Build a C kernel of minivlm/model/ once with the system's C compiler (about a second) into a per-user cache and
load it through ctypes; reused while its source (with the files it includes), flags and CPU are unchanged. Used by
paged_cpu.py, gemv.py, decode_ops.py and decode_layer.py."""
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading

# no -ffast-math: paged_decode.c relies on exp(-inf) = 0; reassociation alone lets the compiler vectorise the sums
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-shared", "-fPIC"]


def cache_dir() -> str:
    return os.environ.get("MINIVLM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "minivlm"))


def cpu_signature() -> bytes:
    """What -march=native compiled for: a cache shared between machines (a network home) must not hand one CPU's
    library to another."""
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(sorted({line for line in f if line.startswith(("model name", "flags"))})).encode()
    except OSError:
        return (platform.machine() + platform.processor()).encode()


def source_bytes(source: str) -> bytes:
    """The file and every local file it #includes ("name.c"), so that a change to any of them rebuilds."""
    with open(source, "rb") as f:
        text = f.read()
    here = os.path.dirname(source)
    return text + b"".join(source_bytes(os.path.join(here, name.decode()))
                           for name in re.findall(rb'#include "([^"]+)"', text))


def build(source: str, defines: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library, None), or (None, why not): no compiler, a failed compile or load. Callers fall back
    instead of failing a request. defines: extra -D flags (a test builds the kernel's other variant)."""
    name = os.path.splitext(os.path.basename(source))[0]
    flags = FLAGS + [f"-D{d}" for d in defines]
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler found"
    try:
        key = hashlib.sha256(source_bytes(source) + " ".join(flags).encode() + cpu_signature()).hexdigest()[:16]
        path = os.path.join(cache_dir(), f"{name}_{key}.so")
        if not os.path.exists(path):
            os.makedirs(cache_dir(), exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir())
            os.close(fd)
            done = subprocess.run([compiler, *flags, source, "-o", tmp, "-lm"], capture_output=True, text=True,
                                  timeout=120)
            if done.returncode:
                os.unlink(tmp)
                return None, f"compiling {name}.c failed: {done.stderr.strip()[-300:]}"
            os.replace(tmp, path)  # atomic: a concurrent process sees the whole library or none
        return ctypes.CDLL(path), None
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{name}.c could not be built or loaded: {e}"


class LazyKernels:
    """A C file's functions, built and loaded once (thread-safe): on first `get()`, or on a background thread from
    `start()` so that no request waits for the compiler (`ready()` never waits). `get()` is None where the build
    failed or the env switch is 0, and `error` then says why (for the status line)."""

    def __init__(self, source: str, env: str, signatures: dict):
        self.source, self.env, self.signatures = source, env, signatures
        self.enabled = os.environ.get(env, "1") != "0"
        self.error: str | None = None
        self._lock, self._loaded = threading.Lock(), []  # [] not tried yet, [None] unavailable, [lib] loaded
        self._builder: threading.Thread | None = None

    def start(self):
        """Build on a daemon thread now (a cached build loads in milliseconds, a fresh one takes about a second)."""
        with self._lock:
            if self.enabled and not self._loaded and self._builder is None:
                self._builder = threading.Thread(target=self.get, name=f"build-{os.path.basename(self.source)}",
                                                 daemon=True)
                self._builder.start()

    def ready(self):
        """The library if it is built already, else None: never waits for a build."""
        return self._loaded[0] if self.enabled and self._loaded else None

    def why_not(self) -> str | None:
        """None if the kernels are on and loaded, else why not ("compiling" while a start() build runs)."""
        if not self.enabled:
            return f"{self.env}=0"
        if not self._loaded and self._builder is not None:
            return "compiling"
        return None if self.get() is not None else self.error

    def get(self):
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    lib, self.error = build(self.source) if self.enabled else (None, f"{self.env}=0")
                    for name, argtypes in self.signatures.items() if lib is not None else ():
                        fn = getattr(lib, name)
                        fn.argtypes, fn.restype = argtypes, None
                    self._loaded.append(lib)
        return self._loaded[0]
