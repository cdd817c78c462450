"""`python -m tools.make_checkpoint_matrix` makes a test checkpoint of any family from the command line (issue #40,
item 8; the README's models section names the command), and an Engine serves what it wrote."""
import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from minivlm import Engine, EngineConfig, Request, SamplingParams
from tools.make_checkpoint import VIDEO_LAYOUTS
from tools.make_checkpoint_matrix import CLI_FAMILIES, VIDEO_LAYOUTS as CLI_LAYOUTS
from tools.video_clips import moving_square

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.make_checkpoint_matrix", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_help_lists_every_family_and_layout():
    run = cli("--help")
    assert run.returncode == 0, run.stderr
    assert sorted(CLI_LAYOUTS) == sorted(VIDEO_LAYOUTS)
    for name in list(CLI_FAMILIES) + list(VIDEO_LAYOUTS):
        assert f"\n  {name} " in run.stdout, name
    bare = cli()  # it used to do nothing, silently
    assert bare.returncode == 2 and "usage: python -m tools.make_checkpoint_matrix" in bare.stderr
    wrong = cli("smolvlm", "/nowhere", "--video-layout", "nested")
    assert wrong.returncode == 2 and "Qwen-VL" in wrong.stderr


def ask(model_dir: str, content: list):
    with Engine(EngineConfig(model=model_dir, num_blocks=64, dtype="float32", device="cpu", max_model_len=1024)) as e:
        return e.generate(Request(messages=[{"role": "user", "content": content}]),
                          SamplingParams(max_tokens=3, ignore_eos=True))


@pytest.mark.parametrize("args,content", [  # each loads a new checkpoint (~10 s): the default run keeps the text one
    pytest.param(["internvl", "--decoder", "qwen2", "--seed", "3"],
                 [{"type": "image", "image": Image.new("RGB", (96, 64), (200, 30, 30))},
                  {"type": "text", "text": "Colour?"}], marks=pytest.mark.slow),
    pytest.param(["qwen2_5_vl", "--video-layout", "nested"],
                 [{"type": "video", "video": moving_square(4), "fps": 2}, {"type": "text", "text": "What happens?"}],
                 marks=pytest.mark.slow),
    (["qwen3"], [{"type": "text", "text": "Hello"}]),
], ids=["internvl-qwen2", "qwen2_5_vl-nested", "qwen3-text"])
def test_cli_checkpoint_loads_and_answers(args, content, tmp_path):
    out_dir = str(tmp_path / args[0])
    run = cli(args[0], out_dir, *args[1:])
    assert run.returncode == 0, run.stderr[-3000:]
    assert out_dir in run.stdout and "python app.py --model" in run.stdout
    assert os.path.isfile(os.path.join(out_dir, "model.safetensors"))
    if "--video-layout" in args:
        assert not os.path.isfile(os.path.join(out_dir, "video_preprocessor_config.json"))
    with open(os.path.join(out_dir, "config.json")) as f:
        assert json.load(f)["model_type"] == args[0]
    out = ask(out_dir, content)
    assert len(out.token_ids) == 3 and out.num_prompt_tokens > 0


def test_readme_command_in_the_models_section(tmp_path):
    """The README's models section names the command (its Quick start keeps its two set-up commands), and the
    command as written there makes a checkpoint an Engine serves."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = quick.split("```bash\n", 1)[1].split("```", 1)[0]
    assert len([line for line in block.splitlines() if line.strip()]) == 2
    assert "make_checkpoint_matrix" not in quick
    models = readme.split("## Models", 1)[1].split("\n## ", 1)[0]
    line = next(x for x in models.splitlines() if x.startswith("python -m tools.make_checkpoint_matrix "))
    command = line.split(" && ")[0].split()
    out_dir = str(tmp_path / "readme")
    command[command.index("/tmp/smolvlm")] = out_dir
    run = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = ask(out_dir, [{"type": "image", "image": Image.new("RGB", (128, 64), (30, 30, 200))},
                        {"type": "text", "text": "Colour?"}])
    assert len(out.token_ids) == 3
