"""Build a C kernel of this folder once with the system's C compiler (about a second) into a per-user cache and
load it through ctypes; reused while its source (with the files it includes), flags and CPU are unchanged. Used by
paged_cpu.py, gemv.py, decode_ops.py and decode_layer.py.

Two flags are optional: OpenMP (Apple clang has no -fopenmp; without it the kernels run on one thread, and the
status line says why; MINIVLM_OPENMP=0 forces that build) and -march=native (-mcpu=native where
the compiler takes only that). A variant the compiler refuses is remembered in the cache beside the library; a
loaded library's `no_openmp` is None, or why it was built without OpenMP (it then runs on one thread)."""
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
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math", "-shared", "-fPIC"]
OPENMP = "-fopenmp"
ARCHES = ("-march=native", "-mcpu=native")  # the first the compiler takes; gcc and clang on x86 take both
OMP_WORDS = ("openmp", "omp.h", "gomp")
REFUSED = OMP_WORDS + ("march", "mcpu", "native")  # words of a compiler refusing an optional flag


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


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


def variants() -> list[list[str]]:
    """The optional flags to try, best first: OpenMP (unless MINIVLM_OPENMP=0), then without it."""
    threads = [[OPENMP], []] if os.environ.get("MINIVLM_OPENMP", "1") != "0" else [[]]
    return [[arch] + omp for omp in threads for arch in ARCHES]


def build(source: str, defines: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library, None), or (None, why not): no compiler, a failed compile or load. Callers fall back
    instead of failing a request. defines: extra -D flags (a test builds the kernel's other variant)."""
    name = os.path.splitext(os.path.basename(source))[0]
    cc = compiler()
    if cc is None:
        return None, "no C compiler found"
    refused = []
    try:
        for extra in variants():
            flags = FLAGS + extra + [f"-D{d}" for d in defines]
            key = hashlib.sha256(source_bytes(source) + " ".join([cc] + flags).encode() + cpu_signature())
            path = os.path.join(cache_dir(), f"{name}_{key.hexdigest()[:16]}.so")
            if os.path.exists(path + ".refused"):  # this compiler refuses one of these flags: the next variant
                with open(path + ".refused") as f:
                    refused.append(f.read())
                continue
            if not os.path.exists(path):
                error = _compile(cc, flags, source, path)
                if error and any(word in error.lower() for word in REFUSED):
                    with open(path + ".refused", "w") as f:
                        f.write(error)
                    refused.append(error)
                    continue
                if error:
                    return None, f"compiling {name}.c failed: {error}"
            lib = ctypes.CDLL(path)
            lib.no_openmp = None if OPENMP in extra else "MINIVLM_OPENMP=0" if os.environ.get("MINIVLM_OPENMP") \
                == "0" else next((r for r in refused if any(w in r.lower() for w in OMP_WORDS)), "no OpenMP")
            return lib, None
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{name}.c could not be built or loaded: {e}"
    return None, f"compiling {name}.c failed: {refused[-1]}"


def _compile(cc: str, flags: list[str], source: str, path: str) -> str | None:
    """Compile into `path` (atomically: a concurrent process sees the whole library or none); None, or the error."""
    os.makedirs(cache_dir(), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir())
    os.close(fd)
    done = subprocess.run([cc, *flags, source, "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
    if done.returncode:
        os.unlink(tmp)
        lines = done.stderr.strip().splitlines()
        return next((ln.strip() for ln in lines if "error" in ln), done.stderr.strip()[-300:] or "failed")[:300]
    os.replace(tmp, path)
    return None


class LazyKernels:
    """A C file's functions, built and loaded once (thread-safe): on first `get()`, or on a background thread from
    `start()` (the loader starts every build, so they compile while the weights load). `get()` waits for a build in
    progress; it is None where the build failed, and `error` then says why (for the status line)."""

    def __init__(self, source: str, signatures: dict):
        self.source, self.signatures = source, signatures
        self.error: str | None = None
        self._lock, self._loaded = threading.Lock(), []  # [] not tried yet, [None] unavailable, [lib] loaded
        self._builder: threading.Thread | None = None

    def start(self):
        """Build on a daemon thread now (a cached build loads in milliseconds, a fresh one takes about a second)."""
        with self._lock:
            if not self._loaded and self._builder is None:
                self._builder = threading.Thread(target=self.get, name=f"build-{os.path.basename(self.source)}",
                                                 daemon=True)
                self._builder.start()

    def get(self):
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    lib, self.error = build(self.source)
                    for name, argtypes in self.signatures.items() if lib is not None else ():
                        fn = getattr(lib, name)
                        fn.argtypes, fn.restype = argtypes, None
                    self._loaded.append(lib)
        return self._loaded[0]

    def variant(self, *defines: str):
        """The library built with extra -D flags (tests and benches check and time a kernel's other variants), its
        functions typed; RuntimeError where it does not build."""
        lib, why = build(self.source, defines)
        if lib is None:
            raise RuntimeError(why)
        for name, argtypes in self.signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, None
        return lib
