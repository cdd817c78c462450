"""docs/ENGINE.md's file map stays true (#52.5): every module under minivlm/ (read from the tree each run, so a file
moved into a subpackage must be moved in the map too) is named in the map, and every minivlm file (.py) the map
names exists. The map is the section "## The map" up to the next "## " heading. A module is named by its path under
minivlm/ or any tail of it that keeps its folder (`engine/request.py`, `backends/base.py` for
model/backends/base.py); a top-level one by its file name (`config.py`); a package's `__init__.py` by itself
(`engine/__init__.py`) or by its folder (`api/`)."""
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "minivlm")
MENTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./]*(?:\.py|/)")


def modules() -> list[str]:
    """Every .py file under minivlm/, as a path relative to it with forward slashes."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [os.path.relpath(os.path.join(folder, f), PACKAGE).replace(os.sep, "/")
                  for f in files if f.endswith(".py")]
    return sorted(found)


def file_map() -> str:
    text = open(os.path.join(REPO, "docs", "ENGINE.md"), encoding="utf-8").read()
    start = text.index("\n## The map")
    return text[start:text.index("\n## ", start + 1)]


def mentions(text: str) -> set[str]:
    """Paths the map names (minivlm/ stripped), leaving out the repository's other folders (tests/, panels/, ...)."""
    others = {d + "/" for d in os.listdir(REPO) if d != "minivlm" and os.path.isdir(os.path.join(REPO, d))}
    found = {m.removeprefix("minivlm/") for m in MENTION.findall(text)}
    return {m for m in found if m and not any(m.startswith(o) for o in others)}


def named(module: str, said: set[str]) -> bool:
    folder, _, name = module.rpartition("/")
    if not folder:
        return module in said
    tails = {"/".join(module.split("/")[i:]) for i in range(module.count("/"))}  # each tail that keeps a folder
    if name == "__init__.py":
        tails |= {"/".join(folder.split("/")[i:]) + "/" for i in range(folder.count("/") + 1)}
    return bool(tails & said)


def test_the_file_map_names_every_module_under_minivlm():
    said = mentions(file_map())
    missing = [m for m in modules() if not named(m, said)]
    assert not missing, f"docs/ENGINE.md's file map does not name: {missing}"


def test_every_minivlm_file_the_map_names_exists():
    everything = modules()
    stale = [m for m in mentions(file_map()) if m.endswith(".py") and not any(
        p == m or p.endswith("/" + m) for p in everything)]
    assert not stale, f"docs/ENGINE.md's file map names what is not under minivlm/: {stale}"


@pytest.mark.parametrize("module, said, expected", [
    ("engine/request.py", {"engine/request.py"}, True),
    ("model/backends/base.py", {"backends/base.py"}, True),
    ("api/server.py", {"server.py"}, False),  # a bare name could be any package's
    ("config.py", {"config.py"}, True),
    ("kv_events/config.py", {"config.py"}, False),
    ("api/__init__.py", {"api/"}, True),
    ("engine/kv/block_manager.py", {"engine/block_manager.py"}, False),  # moved: the map must follow
])
def test_the_naming_rule(module, said, expected):
    assert named(module, said) is expected


def test_a_gradio_space_installs_the_debian_packages_the_dockerfile_does():
    """The Dockerfile says the Space without Docker installs the same from packages.txt (#52.5: the CJK font was
    missing there): the two lists are one set."""
    docker = open(os.path.join(REPO, "Dockerfile"), encoding="utf-8").read()
    line = re.search(r"apt-get install -y (.*?)(?:\\\s*)?&&", docker, re.DOTALL).group(1)
    wanted = {w for w in line.replace("\\", " ").split() if not w.startswith("-")}
    listed = set(open(os.path.join(REPO, "packages.txt"), encoding="utf-8").read().split())
    assert "fonts-noto-cjk" in wanted and listed == wanted, (listed, wanted)
