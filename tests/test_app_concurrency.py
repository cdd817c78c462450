"""Many users at once against the running app: everyone is answered, nobody gets another's answer, and no
KV block stays referenced afterwards."""
import os
import threading

import pytest
from gradio_client import Client

from tests.app_server import running_app
from tests.test_app_client import EXAMPLES, answer, ask

QUESTION = "How many shapes are there?"


@pytest.mark.slow
def test_32_clients_x_4_requests_no_cross_talk(tmp_path):
    images = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".png"))
    with running_app("--num-blocks", "256", log_path=str(tmp_path / "app.log")) as url:
        solo_client = Client(url, verbose=False)
        solo = {img: answer(ask(solo_client, QUESTION, [img])[0]) for img in images}  # one user at a time
        results, errors = [], []

        def user(i: int):
            try:
                client = Client(url, verbose=False)
                for k in range(4):
                    img = images[(i + k) % len(images)]
                    results.append((img, answer(ask(client, QUESTION, [img])[0])))
            except Exception as e:  # surfaced below with the user's number
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=user, args=(i,)) for i in range(32)]
        [t.start() for t in threads]
        [t.join(timeout=600) for t in threads]
        assert not errors, errors[:3]
        assert len(results) == 32 * 4
        assert [(img, a) for img, a in results if a != solo[img]] == []  # no cross-talk between sessions
        _, _, now, *_ = solo_client.predict(api_name="/kv_snapshot")  # map, table, summary, timeline, log, step
        assert "running 0 · waiting 0" in now and "blocks used 0 /" in now
