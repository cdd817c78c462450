"""A minivlm engine publishing KV events, in its own process, driven line by line on stdin (first, hit, evict,
reset, restart, quit); after each command it prints one JSON line: the last batch's sequence number and the
engine's own prefix tree (key, parent key, kind, tokens), so a watcher in another process can compare."""
import json
import os
import sys

from minivlm import Engine, EngineConfig, Request, SamplingParams
from panels.holder import EXAMPLES_DIR

PARAMS = SamplingParams(max_tokens=20, ignore_eos=True)


def requests(prompt: str, names: list[str]) -> list[Request]:
    return [Request(prompt=prompt, images=[os.path.join(EXAMPLES_DIR, n)]) for n in names]


RUNS = {"first": requests("Describe the picture.", ["three_shapes.png", "two_shapes.png", "three_shapes.png"]),
        "hit": requests("Describe the picture.", ["three_shapes.png"]) + requests("What is it?", ["red_circle.png"]),
        "evict": requests("Where is the shape?", ["blue_circle.png", "green_triangle.png", "yellow_square.png",
                                                  "red_circle.png"])}


def main():
    model, kv_events = sys.argv[1], json.loads(sys.argv[2])
    config = EngineConfig(model=model, device="cpu", dtype="float32", num_blocks=24, max_model_len=512,
                          kv_events=kv_events)
    engine = Engine(config)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "reset":
            engine.reset_prefix_cache()
        elif cmd == "restart":  # a new engine (a new publisher) on the same endpoint: its seq starts at 0 again
            engine.close()
            engine = Engine(config)
        else:
            engine.generate(RUNS[cmd], PARAMS)
        tree = [[n.key, n.parent_key, n.kind, n.num_tokens] for n in engine.prefix_tree()]
        print(json.dumps({"last_seq": engine.kv_events_stats()["next_seq"] - 1, "tree": tree}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
