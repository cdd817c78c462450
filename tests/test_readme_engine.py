"""README's engine example stays true (#52.5): the Python block under "### The engine in Python" is run exactly as
written (a fresh interpreter in the repository's root, as a notebook user runs it) and prints what its last line's
comment says it prints."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_example() -> str:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("\n### The engine in Python\n"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readmes_engine_example_prints_what_it_says():
    code = readme_example()
    lines = code.strip().splitlines()
    said = lines[-1].rpartition("# ")[2].strip()
    assert len(lines) == 5 and said, code  # five lines, the last one saying what it prints
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == said, (done.stdout, done.stderr[-2000:])
