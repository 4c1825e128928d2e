"""``hfcheck sweep --ray`` on a real Ray cluster, started here on 127.0.0.1: a head and a second
node process, one CPU each (``ray start``, each in its own session, under a private temp dir).

The sweep over the same targets gives the same results as the local pool (timings aside), keeps
going past a model that hangs, one that kills its worker and one that kills its Ray actor, shares
the result cache with local sweeps both ways, and leaves nothing running on the cluster. At
the end the cluster's processes are killed by session (never ``ray stop``, which would stop
every Ray instance on the machine) and the test fails if a raylet or GCS of it remains.

Also here: the runtime cross-check's batches as Ray tasks (``scripts/runtime_crosscheck.py
--ray``), with a fake batch command in place of real vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the [ray] extra is not installed")

from leftovers import no_leftover_processes  # noqa: F401 - autouse: a leaked process fails its own test only

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "analyzer" / "data" / "bundled"
SMALL = json.loads((BUNDLED / "Qwen__Qwen3-0.6B" / "config.json").read_text())
LARGER = json.loads((BUNDLED / "Qwen__Qwen3-4B" / "config.json").read_text())
RAY_CLI = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (session id, state, command line)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out[int(entry.name)] = (os.getsid(int(entry.name)), state, cmd)
            except (OSError, IndexError):
                continue
    return out


@dataclass
class Cluster:
    address: str
    temp: Path
    sessions: tuple[int, ...]

    def running(self) -> list[str]:
        """This cluster's live processes: in its sessions, or naming its temp dir."""
        return [f"{pid} {cmd[:150]}" for pid, (sid, state, cmd) in processes().items()
                if state != "Z" and (sid in self.sessions or str(self.temp) in cmd)]

    def kill(self) -> None:
        for pid, (sid, state, cmd) in processes().items():
            if state != "Z" and (sid in self.sessions or str(self.temp) in cmd):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def ray_start(args: list[str], env: dict, log: Path) -> int:
    """``ray start ...`` in a new session (its daemons stay in it); returns the session id."""
    with open(log, "ab") as out:
        proc = subprocess.Popen([RAY_CLI, "start", *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        code = proc.wait(180)
    assert code == 0, log.read_text()[-3000:]
    return proc.pid


@pytest.fixture(scope="module")
def ray_cluster():
    temp = Path(tempfile.mkdtemp(prefix="hfr-", dir="/tmp"))  # short: Ray's unix sockets live under it
    (temp / "tmp").mkdir()
    port = free_port()
    (temp / "home").mkdir()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(temp / "tmp"), "HOME": str(temp / "home")}
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    sessions = []
    cluster = Cluster(f"127.0.0.1:{port}", temp, ())
    try:
        sessions.append(ray_start(["--head", f"--port={port}", f"--temp-dir={temp}", "--include-dashboard=false",
                                   f"--dashboard-agent-listen-port={free_port()}", *common], env, temp / "head.log"))
        cluster.sessions = tuple(sessions)
        sessions.append(ray_start([f"--address={cluster.address}", f"--dashboard-agent-listen-port={free_port()}", *common], env, temp / "node.log"))
        cluster.sessions = tuple(sessions)
        yield cluster
    finally:
        cluster.kill()
        deadline = time.monotonic() + 20
        while (left := cluster.running()) and time.monotonic() < deadline:
            time.sleep(0.2)
            cluster.kill()
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, left
        assert not [p for p in left if "raylet" in p or "gcs_server" in p]


def folder(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def sweep(tmp_path: Path, *args: str, cache: str, **env: str) -> subprocess.CompletedProcess:
    """``hfcheck sweep ... --format json`` with its caches, the Hub's and a home of its own under
    ``tmp_path`` (Ray reads and writes ``~/.ray``: the user's home is never the test's)."""
    (tmp_path / "home").mkdir(exist_ok=True)
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HFCHECK_CACHE_DIR": str(tmp_path / cache),
            "HOME": str(tmp_path / "home"), "RAY_USAGE_STATS_ENABLED": "0", **env}
    return subprocess.run([sys.executable, "-m", "hfcheck.sweep", *args, "--format", "json"],
                          capture_output=True, text=True, env=full, timeout=400, cwd=tmp_path)


def without_timings(value: dict) -> dict:
    return {k: v for k, v in value.items() if k != "timings_s"}


def leftovers_on(cluster: Cluster, seconds: float = 20) -> list[str]:
    """What of the sweep is still running on the cluster (its actors, their workers) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in cluster.running() if "NodeWorker" in p or "spawn_main" in p]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.3)


def test_ray_sweep_equals_the_local_pool_survives_hang_crash_and_dead_actor(ray_cluster, tmp_path):
    small, same = folder(tmp_path / "small", SMALL), folder(tmp_path / "small-ft", {**SMALL, "_name_or_path": "me/small-ft"})
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    hang = folder(tmp_path / "hangs", LARGER)
    crash = folder(tmp_path / "crashes", {**SMALL, "hidden_act": "gelu"})
    killer = folder(tmp_path / "kills-its-actor", {**SMALL, "rms_norm_eps": 1e-5})
    targets = ["type:llama", str(small), str(same), str(garbage), str(hang), str(crash)]
    hooks = {"HFCHECK_TEST_HANG": str(hang), "HFCHECK_TEST_CRASH": str(crash), "HFCHECK_TEST_KILL_ACTOR": str(killer)}

    on_ray = sweep(tmp_path, targets[0], str(killer), *targets[1:], "--timeout", "10", "--ray", ray_cluster.address, cache="ray-cache", **hooks)
    assert on_ray.returncode == 0, on_ray.stderr
    assert leftovers_on(ray_cluster) == []
    local = sweep(tmp_path, *targets, "--timeout", "10", "--jobs", "2", cache="local-cache", **hooks)
    assert local.returncode == 0, local.stderr

    ray_out, local_out = json.loads(on_ray.stdout), json.loads(local.stdout)
    assert [k for k in ray_out if k != str(killer)] == list(local_out)
    for key, value in local_out.items():  # the same results, the failures' texts included
        assert without_timings(ray_out[key]) == without_timings(value), key
    assert local_out[str(hang)]["error"] == "analysis failed: timed out after 10 s (worker killed)"
    assert local_out[str(crash)]["error"].startswith("analysis failed: worker crashed (SIGABRT): Aborted")
    assert local_out["llama"]["verdict"] == local_out[str(small)]["verdict"] == "native-speed"
    assert ray_out[str(killer)]["error"].startswith("analysis failed: worker crashed (Ray actor died on "), ray_out[str(killer)]
    # two actors (one per node), and one more in place of the one that died
    assert "7 of 7 targets" in on_ray.stderr and "(5 analysed, 0 from cache, 4 failed, 1 answered by an identical config" in on_ray.stderr, on_ray.stderr
    assert "on Ray (3 actors)" in on_ray.stderr, on_ray.stderr

    # one cache, whoever analysed: a local sweep reuses the cluster's results and the cluster the local ones
    cached = [t for t in targets if t not in (str(hang), str(crash))]  # a timeout or a crash is never cached
    again = sweep(tmp_path, *cached, "--jobs", "1", cache="ray-cache")
    assert "(0 analysed, 3 from cache, 1 failed" in again.stderr, again.stderr
    mixed = sweep(tmp_path, *cached, "type:qwen3", "--ray", ray_cluster.address, cache="local-cache")
    assert mixed.returncode == 0, mixed.stderr
    assert "(1 analysed, 3 from cache, 1 failed" in mixed.stderr, mixed.stderr
    back = sweep(tmp_path, "type:qwen3", "--jobs", "1", cache="local-cache")
    assert "(0 analysed, 1 from cache" in back.stderr and json.loads(back.stdout) == {"qwen3": json.loads(mixed.stdout)["qwen3"]}
    assert leftovers_on(ray_cluster) == []


def test_a_local_instance_leaves_nothing_in_the_home(tmp_path):
    """``--ray`` alone with nothing running starts a local Ray instance. Ray turns token
    authentication on for it and, left alone, writes the token to ``~/.ray/auth_token``, which
    then puts every later Ray client of the user in token mode (the cluster fixture above, started
    without authentication, refused them: InvalidAuthToken). The sweep's instance gets its token
    in its environment: the home stays as it was, the instance is gone afterwards."""
    private_tmp = Path(tempfile.mkdtemp(prefix="hfl-", dir="/tmp"))  # short: Ray's unix sockets live under it
    try:
        run = sweep(tmp_path, "type:qwen3", "--ray", "--no-cache", cache="c", TMPDIR=str(private_tmp))
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout)["qwen3"]["verdict"] == "native-speed"
        assert "on Ray (1 actors)" in run.stderr, run.stderr[-2000:]
        assert list((tmp_path / "home").iterdir()) == []
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def test_ray_address_that_answers_nothing_is_one_line(tmp_path):
    run = sweep(tmp_path, "type:llama", "--ray", f"127.0.0.1:{free_port()}", "--no-cache", cache="c")
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("hfcheck: error: cannot connect to the Ray cluster at 127.0.0.1:"), run.stderr


# ----------------------------------------------------------- the runtime cross-check's batches

FAKE_BATCH = """#!{python}
# Stands for `python -m hfcheck.runtime.batch ROOT` (ROOT/job.json, as hfcheck.isolation.jobs writes
# it): a row per model type, the type it is on in the progress file first; "crash" ends the process
# the way a fatal vLLM error would.
import json, os, sys
job = json.load(open(os.path.join(sys.argv[-1], "job.json")))
for model_type in job["model_types"]:
    open(job["progress"], "w").write(model_type)
    if model_type == "crash":
        os._exit(3)
    with open(job["out"], "a") as out:
        out.write(json.dumps({{"model_type": model_type, "status": "loaded", "verdict": "runs", "vllm": job["vllm_version"]}}) + "\\n")
"""


def crosscheck_module():
    spec = importlib.util.spec_from_file_location("runtime_crosscheck", ROOT / "scripts" / "runtime_crosscheck.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["runtime_crosscheck"] = module
    spec.loader.exec_module(module)
    return module


def test_runtime_crosscheck_batches_as_ray_tasks(ray_cluster, tmp_path):
    import ray

    crosscheck = crosscheck_module()
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_BATCH.format(python=sys.executable))
    fake.chmod(0o755)
    types = ["a", "b", "crash", "c", "d", "e"]
    lines: list[str] = []
    rows = {}
    try:
        for where in ("local", "ray"):
            out = tmp_path / f"{where}.jsonl"
            crosscheck.run(types, fake, "0.0-test", out, 2, 5.0, lines.append, ray=ray_cluster.address if where == "ray" else None, cpus_per_batch=1)
            rows[where] = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["model_type"])
    finally:
        ray.shutdown()
    # every type once; the crash costs its own row only, the rest of its batch runs again
    assert rows["ray"] == rows["local"]
    assert [r["model_type"] for r in rows["ray"]] == sorted(types)
    crashed = next(r for r in rows["ray"] if r["model_type"] == "crash")
    assert crashed == {"model_type": "crash", "status": "crashed", "error": "the process ended with status 3 while running it", "vllm": "0.0-test"}
    assert any("on Ray" in line for line in lines)
    assert leftovers_on(ray_cluster) == []


# ------------------------------------------------------------------------------- the dashboard


def test_dashboard_watches_a_cluster_sweep(ray_cluster, tmp_path, monkeypatch):
    """``hfcheck tui --ray``: the same rows, filled live from the cluster's actors."""
    pytest.importorskip("textual", reason="the [tui] extra (textual) is not installed")
    import asyncio

    from hfcheck.analyzer.sources.model_types import parse_refs
    from hfcheck.tui.app import Dashboard

    monkeypatch.setenv("HFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    small, same = folder(tmp_path / "small", SMALL), folder(tmp_path / "small-ft", {**SMALL, "_name_or_path": "me/small-ft"})
    larger = folder(tmp_path / "larger", LARGER)
    refs = [str(small), str(same), str(larger)]
    app = Dashboard(parse_refs(refs), timeout=120, ray=ray_cluster.address, scope="test")

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 240
            while app.counts()["done"] < len(refs):
                assert time.monotonic() < deadline, app.counts()
                await pilot.pause(0.2)
            await pilot.pause(0.3)
            return {k: (e.result or {}).get("report", {}).get("verdict") for k, e in app.entries.items()}

    verdicts = asyncio.run(scenario())
    assert verdicts == {str(small): "native-speed", str(same): "native-speed", str(larger): "native-speed"}
    assert app.entries[str(same)].result["config_hash"] == app.entries[str(small)].result["config_hash"]
    assert app.entries[str(same)].result["report"]["model"]["ref"] == str(same)
    assert leftovers_on(ray_cluster) == []
