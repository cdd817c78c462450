"""python -m bench.llamacpp_build: build llama.cpp (CPU only) from the source the llama-cpp-python sdist vendors.

The build lands in a git-ignored cache (`.cache/llamacpp/` at the repo root) and is reused while its stamp
(sdist version + cmake flags) matches. It compiles C++ for minutes; run it niced on a shared machine.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

SDIST_VERSION = "0.3.36"
CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "llamacpp")
# One server answers every peer row (single stream -np 1, the batch -np 16 -cb); llama-quantize makes Q4_K_M,
# which the converter cannot write (its --outtype stops at q8_0).
TARGETS = ("llama-server", "llama-quantize")
# Release, CPU only; no network features (OpenSSL, prebuilt web UI) and nothing the bench does not run.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
               "-DLLAMA_BUILD_TOOLS=ON", "-DBUILD_SHARED_LIBS=OFF")


def source_dir(cache=CACHE_DIR) -> str:
    """The vendored llama.cpp tree (converter, gguf-py, C++ sources) inside the extracted sdist."""
    return os.path.join(cache, "src", f"llama_cpp_python-{SDIST_VERSION}", "vendor", "llama.cpp")


def binary(name: str, cache=CACHE_DIR) -> str:
    """Path of a built llama.cpp binary (it may not exist yet)."""
    return os.path.join(cache, "build", "bin", name)


def stamp() -> dict:
    return {"sdist": f"llama-cpp-python=={SDIST_VERSION}", "cmake": list(CMAKE_FLAGS), "targets": list(TARGETS)}


def is_built(cache=CACHE_DIR) -> bool:
    """True when every target exists and was built from this sdist with these flags."""
    path = os.path.join(cache, "build", "minivlm-stamp.json")
    if not os.path.exists(path) or not all(os.path.exists(binary(t, cache)) for t in TARGETS):
        return False
    with open(path) as f:
        return json.load(f) == stamp()


def configure_command(cache=CACHE_DIR) -> list:
    return ["cmake", "-S", source_dir(cache), "-B", os.path.join(cache, "build"), *CMAKE_FLAGS]


def build_command(jobs: int, cache=CACHE_DIR) -> list:
    return ["cmake", "--build", os.path.join(cache, "build"), "-j", str(jobs), "--target", *TARGETS]


def fetch_sdist(cache=CACHE_DIR, sdist=None, log=print) -> str:
    """The sdist tarball: the given file, one already in the cache, or `pip download` into the cache."""
    if sdist:
        return sdist
    found = glob.glob(os.path.join(cache, f"llama_cpp_python-{SDIST_VERSION}.tar.gz"))
    if found:
        return found[0]
    os.makedirs(cache, exist_ok=True)
    log(f"[llamacpp] downloading the llama-cpp-python {SDIST_VERSION} sdist (source only) into {cache}")
    subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={SDIST_VERSION}", "--no-deps",
                    "--no-binary", ":all:", "-d", cache], check=True)
    return glob.glob(os.path.join(cache, f"llama_cpp_python-{SDIST_VERSION}.tar.gz"))[0]


def extract(tarball: str, cache=CACHE_DIR, log=print) -> str:
    """Unpack only the vendored llama.cpp tree (the Python bindings are not used)."""
    if os.path.exists(os.path.join(source_dir(cache), "CMakeLists.txt")):
        return source_dir(cache)
    prefix = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
    log(f"[llamacpp] extracting {prefix} from {os.path.basename(tarball)}")
    os.makedirs(os.path.join(cache, "src"), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=cache)
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp, members=[m for m in tar.getmembers() if m.name.startswith(prefix)], filter="data")
    os.replace(os.path.join(tmp, f"llama_cpp_python-{SDIST_VERSION}"),
               os.path.join(cache, "src", f"llama_cpp_python-{SDIST_VERSION}"))
    shutil.rmtree(tmp)
    return source_dir(cache)


def ensure_built(cache=CACHE_DIR, sdist=None, jobs=2, nice=True, log=print) -> str:
    """Build llama.cpp unless an up-to-date build is cached; returns the bin directory."""
    if is_built(cache):
        return os.path.dirname(binary(TARGETS[0], cache))
    if shutil.which("cmake") is None:
        raise RuntimeError("building llama.cpp needs cmake and a C++ compiler (apt-get install cmake g++)")
    extract(fetch_sdist(cache, sdist, log), cache, log)
    prefix = ["nice", "-n", "19"] if nice and shutil.which("nice") else []
    log(f"[llamacpp] building {', '.join(TARGETS)} with -j{jobs} into {cache}/build (several minutes)")
    subprocess.run(prefix + configure_command(cache), check=True)
    subprocess.run(prefix + build_command(jobs, cache), check=True)
    with open(os.path.join(cache, "build", "minivlm-stamp.json"), "w") as f:
        json.dump(stamp(), f)
    return os.path.dirname(binary(TARGETS[0], cache))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.llamacpp_build", description=__doc__)
    ap.add_argument("--cache", default=CACHE_DIR, help="where the source and build go (default %(default)s)")
    ap.add_argument("--sdist", help="a downloaded llama_cpp_python-%s.tar.gz (else pip downloads it)" % SDIST_VERSION)
    ap.add_argument("-j", "--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    ap.add_argument("--no-nice", action="store_true", help="do not run the compiler under nice -n 19")
    args = ap.parse_args(argv)
    print(ensure_built(args.cache, args.sdist, args.jobs, not args.no_nice))


if __name__ == "__main__":
    main()
