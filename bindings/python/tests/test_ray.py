"""mica on Ray Serve (deploy/ray): a local Ray cluster with two replicas of the test model
behind the OpenAI-compatible ingress; 20 chat requests through the ``openai`` SDK. Both
replicas serve, and requests sharing a long prefix land on one replica and reuse its
prefix cache (``usage.prompt_tokens_details.cached_tokens``). Also the autoscaling
policy on queue depth, and the Serve config file against Ray's schema. Bounded: the
cluster has a time limit (``RAY_TEST_TIMEOUT``, default 240 s).

Run by ``scripts/test-ray`` (which installs ``ray[serve]``), not by the default test
command."""

from __future__ import annotations

import collections
import os
import socket
import sys
import threading
import time

import pytest

from conftest import REPO

import ray  # scripts/test-ray installs ray[serve] (requirements-ray.txt)

pytestmark = pytest.mark.ray

RAY_DIR = REPO / "deploy" / "ray"
LONG_SYSTEM = (
    "You are the harbour master's assistant in a small fishing town. You know the tides, "
    "the moorings, the names of every boat and their skippers, the weather lore of the "
    "coast and the rules of the harbour: no engines inside the breakwater after dark, "
    "nets dried on the east quay only, and visitors moor on the outer pontoon. Answer "
    "briefly and politely, and never invent a rule that is not on this list."
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_url(smol_path):
    if str(RAY_DIR) not in sys.path:
        sys.path.insert(0, str(RAY_DIR))
    from ray import serve

    import mica_serve

    deadline = float(os.environ.get("RAY_TEST_TIMEOUT", "240"))
    timer = threading.Timer(deadline, lambda: os._exit(124))  # a hung cluster fails the run
    timer.daemon = True
    timer.start()
    port = free_port()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(RAY_DIR), *sys.path])}},
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = mica_serve.build_app({"model": str(smol_path), "replicas": 2, "threads": 1,
                                    "kv_mem": 64 << 20, "name": "smol"})
        serve.run(app, name="mica", route_prefix="/", blocking=False)
        _wait_ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        timer.cancel()


def _wait_ready(url: str, timeout: float = 120) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail("Ray Serve did not become ready")


def test_two_replicas_prefix_affinity(serve_url):
    import openai
    from concurrent.futures import ThreadPoolExecutor

    client = openai.OpenAI(base_url=serve_url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["smol"]

    def ask(messages):
        r = client.chat.completions.create(model="smol", messages=messages, max_tokens=8,
                                           temperature=0)
        return r.system_fingerprint, r.usage.prompt_tokens_details.cached_tokens

    # 10 short, different requests, 4 at a time: spread over the replicas by load.
    short = [[{"role": "user", "content": f"Say the number {i} in words."}] for i in range(10)]
    with ThreadPoolExecutor(4) as pool:
        spread = list(pool.map(ask, short))
    # 10 requests sharing a long system prompt, one after another: one replica, cache hits.
    shared = [ask([{"role": "system", "content": LONG_SYSTEM},
                   {"role": "user", "content": q}])
              for q in ["Where do visitors moor?", "Can I dry nets on the west quay?",
                        "Are engines allowed at night?", "Who makes the rules?",
                        "What is the tide now?", "Is there a pontoon?", "Hello!",
                        "Can I bring a dog?", "Where is the east quay?", "Thank you."]]

    replicas = collections.Counter(fp for fp, _ in spread + shared)
    assert len(replicas) == 2, f"expected both replicas to serve: {replicas}"
    owners = {fp for fp, _ in shared}
    assert len(owners) == 1, f"the shared-prefix requests were split: {shared}"
    cached = [c for _, c in shared]
    assert all(c > 0 for c in cached[1:]), f"no prefix-cache hits after the first: {cached}"

    # Streaming through the same route.
    stream = client.chat.completions.create(model="smol", max_tokens=8, temperature=0,
                                            stream=True,
                                            messages=[{"role": "user", "content": "Hi"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text

    # Errors keep OpenAI's shape and status.
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smol", messages=short[0], top_p=2.0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=short[0])


def test_queue_depth_policy():
    if str(RAY_DIR) not in sys.path:
        sys.path.insert(0, str(RAY_DIR))
    import mica_serve

    class Ctx:
        def __init__(self, n, queue, running):
            self.current_num_replicas = n
            self.policy_state = {}
            self.aggregated_metrics = {
                "mica_queue_depth": {i: q for i, q in enumerate(queue)},
                "mica_running": {i: r for i, r in enumerate(running)},
            }

    policy = mica_serve.queue_depth_policy
    assert policy(Ctx(2, [0, 0], [3, 4]), 2.0, 8)[0] == 1  # fits on one: down
    assert policy(Ctx(2, [0, 0], [8, 8]), 2.0, 8)[0] == 2  # busy, nothing waits: stay
    assert policy(Ctx(2, [3, 3], [8, 8]), 2.0, 8)[0] == 3  # queues above target: up
    assert policy(Ctx(2, [9, 9], [8, 8]), 2.0, 8)[0] == 6  # far above: up faster
    assert policy(Ctx(1, [1, ], [8]), 2.0, 8)[0] == 1


def test_ray_serve_config_is_valid():
    import yaml
    from ray.serve.schema import ServeDeploySchema

    if str(RAY_DIR) not in sys.path:
        sys.path.insert(0, str(RAY_DIR))
    import mica_serve

    cfg = yaml.safe_load((RAY_DIR / "serve-config.yaml").read_text())
    ServeDeploySchema.model_validate(cfg)
    app = cfg["applications"][0]
    assert app["import_path"] == "mica_serve:build_app"
    built = mica_serve.build_app(app["args"])  # the args build an application graph
    assert built is not None
