"""A worker node of a real local Ray cluster that dies mid-run, under Ray Data
(sensegraph/index/ray_data.py). A module of its own, with a cluster of its own: the dead node
stays in that cluster's records (and this driver's), and the other Ray tests must not run on a
cluster that has lost a node."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from mock_llm import start_mock_server  # noqa: E402
from sensegraph.index.pipeline import run_index  # noqa: E402
from test_pipeline import snapshot  # noqa: E402
from test_ray import RAY, cluster, project  # noqa: E402,F401 - the fixture: this module's own head and worker node


def test_a_ray_data_worker_node_killed_mid_run_loses_no_item(cluster, tmp_path):
    # A third node joins for this test; once an actor runs there and extraction is under way,
    # the whole node dies (its raylet, object store and workers: SIGKILL to its process group).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    node = subprocess.Popen([*RAY, "start", f"--address={cluster}", "--num-cpus=1", "--block"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # Ray Data places the actors on the nodes the cluster knows when the run starts: wait until
        # the head counts the third node's CPU (seconds after its raylet starts, longer under load;
        # a fixed pause was too short once in CI and no actor went there).
        deadline = time.monotonic() + 90
        while _cpus(cluster, env) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _raylet(node.pid) and _cpus(cluster, env) == 3, "the third node did not join the cluster"
        data = {"address": cluster, "data": True, "data_path": str(tmp_path / "partitions"), "partition_units": 1,
                "workers": 3}  # one actor per node: Ray Data spreads them
        with start_mock_server(latency=0.3) as a, start_mock_server(latency=0.3) as b:
            settings = project(tmp_path / "ray", [a.base_url, b.base_url], ray=data)
            seen: list[bool] = []

            def kill_node() -> None:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and not (
                        a.stats["requests"] + b.stats["requests"] >= 4 and _workers_of(node.pid, "MapBatches")):
                    time.sleep(0.05)
                actors = _workers_of(node.pid, "MapBatches")
                seen.append(bool(actors))
                for pid in _workers_of(node.pid, ""):  # each worker has a process group of its own
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:  # ended since it was listed: the node must die still
                        pass
                os.killpg(node.pid, signal.SIGKILL)
                seen.append(True)

            killer = threading.Thread(target=kill_node)
            killer.start()
            # Ray Data restarts the node's actors elsewhere and runs their partitions again; the
            # actor that numbers them stays on the driver's node, so the restarted ones find it.
            result = asyncio.run(run_index(settings, log=lambda m: None))
            killer.join()
            alone = project(tmp_path / "alone", [a.base_url, b.base_url])
            asyncio.run(run_index(alone, log=lambda m: None))
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()
    assert seen == [True, True]  # an actor was on the node when it died, and the node was killed
    assert not result.failures
    assert snapshot(tmp_path / "ray" / "output") == snapshot(tmp_path / "alone" / "output")


def _cpus(address: str, env: dict) -> float:
    """The CPUs the cluster at `address` counts now (its autoscaler's view, which the head
    refreshes every few seconds), 0 while it cannot tell."""
    out = subprocess.run([*RAY, "status", f"--address={address}"], capture_output=True, text=True, env=env).stdout
    match = re.search(r"/([0-9.]+) CPU", out)
    return float(match.group(1)) if match else 0.0


def _raylet(pgid: int) -> list[str]:
    """The pid of the raylet of the node started in process group `pgid` (or nothing yet)."""
    return subprocess.run(["pgrep", "-g", str(pgid), "-f", "raylet/raylet"], capture_output=True, text=True).stdout.split()


def _workers_of(pgid: int, pattern: str) -> list[str]:
    """Pids of that node's worker processes whose command line matches `pattern` (the raylet
    starts them, each in a process group of its own)."""
    return [pid for raylet in _raylet(pgid) for pid in subprocess.run(
        ["pgrep", "-P", raylet, "-f", pattern or "."], capture_output=True, text=True).stdout.split()]
