"""A sweep of 10,000 Hub repositories, listed and read through huggingface_hub from a local
Hub-compatible endpoint: the local worker pool against Ray on the same machine.

    .venv/bin/python benchmarks/bench_sweep_scale.py [--repos 10000] [--unique 0.005] [--modes local,ray]

The synthetic Hub (``tests/hub_endpoint.py`` on 127.0.0.1, HF_ENDPOINT) holds fine-tunes of 10
base configs (hfcheck's bundled real configs, and each with another dtype); a fine-tune's
config.json differs from its base only in ``_name_or_path`` and ``transformers_version``, as
most do, and a share (``--unique``) also changes a field the analysis reads, so each of those is
a config of its own. Every mode runs ``hfcheck sweep --author bench --limit all`` in a fresh
process with an empty HF cache and an empty result cache: list 10,000 ids (10 pages), read each
config (HEAD + GET config.json, HEAD generation_config.json), fold identical configs, analyse
each distinct one once. Ray: a local instance (``ray start --head`` with this machine's CPUs,
in its own session, killed afterwards). Prints targets per second and the deduplication ratio
(targets per analysis).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hub_endpoint import Hub, hub_env  # noqa: E402

BASES = ["Qwen__Qwen3-0.6B", "Qwen__Qwen3-4B", "Qwen__Qwen3-32B", "meta-llama__Llama-3.1-8B", "mistralai__Mixtral-8x7B-v0.1"]


def base_configs() -> list[tuple[str, dict]]:
    out = []
    for name in BASES:
        config = json.loads((ROOT / "analyzer" / "data" / "bundled" / name / "config.json").read_text())
        short = name.split("__")[1].lower()
        out.append((short, config))
        out.append((f"{short}-fp16", {**config, "torch_dtype": "float16", "dtype": "float16"}))
    return out


def build_hub(repos: int, unique: float, seed: int = 0) -> Hub:
    rng = random.Random(seed)
    hub = Hub()
    bases = base_configs()
    for i in range(repos):
        short, config = bases[i % len(bases)]
        repo_id = f"bench/{short}-ft-{i:05d}"
        config = {**config, "_name_or_path": repo_id, "transformers_version": rng.choice(["5.0.0", "5.19.1", "5.24.0"])}
        if rng.random() < unique:  # a fine-tune that changed something the analysis reads
            config["max_position_embeddings"] = 4096 + i
        hub.add(repo_id, config, downloads=rng.randrange(1_000_000))
    return hub.start()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ray(temp: Path) -> tuple[str, int]:
    port = free_port()
    proc = subprocess.run([str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                           f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats", f"--num-cpus={os.cpu_count()}"],
                          capture_output=True, text=True, start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    if proc.returncode != 0:
        raise SystemExit(f"ray start failed: {proc.stderr[-2000:]}")
    return f"127.0.0.1:{port}", _session_of(temp)


def _session_of(temp: Path) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if "gcs_server" in (entry / "cmdline").read_text() and str(temp) in (entry / "cmdline").read_text():
                    return os.getsid(int(entry.name))
            except OSError:
                continue
    raise SystemExit("the Ray head's processes were not found")


def stop_ray(session: int, temp: Path) -> None:
    for _ in range(50):
        alive = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z" and (os.getsid(int(entry.name)) == session or str(temp) in (entry / "cmdline").read_text()):
                        alive.append(int(entry.name))
                except (OSError, IndexError):
                    continue
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def run_sweep(hub: Hub, work: Path, extra: list[str]) -> dict:
    env = hub_env(os.environ, hub.url, work)
    env["HFCHECK_CACHE_DIR"] = str(work / "cache")
    before = dict(hub.requests)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hfcheck.sweep", "--author", "bench", "--limit", "all", "--format", "json", *extra],
                          capture_output=True, text=True, env=env, cwd=work, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({proc.returncode}): {proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    summary = proc.stderr.strip().splitlines()[-1]
    analysed = int(re.search(r"\((\d+) analysed", summary).group(1))
    return {
        "targets": len(out),
        "distinct": len({v.get("config_hash") for v in out.values()}),
        "failed": sum("error" in v for v in out.values()),
        "analysed": analysed,
        "wall_s": wall,
        "requests": {k: hub.requests[k] - before.get(k, 0) for k in hub.requests},
        "summary": summary,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repos", type=int, default=10_000)
    parser.add_argument("--unique", type=float, default=0.005, help="share of fine-tunes with a config of their own (default 0.005)")
    parser.add_argument("--modes", default="local,ray")
    args = parser.parse_args()

    t0 = time.perf_counter()
    hub = build_hub(args.repos, args.unique)
    print(f"synthetic Hub: {args.repos} repositories at {hub.url} ({time.perf_counter() - t0:.1f} s to build); {os.cpu_count()} CPUs", flush=True)
    rows = []
    try:
        for mode in args.modes.split(","):
            work = Path(tempfile.mkdtemp(prefix=f"hfb-{mode}-", dir="/tmp"))
            session = None
            try:
                extra = ["--no-atlas"]
                if mode == "ray":
                    address, session = start_ray(work / "ray")
                    extra += ["--ray", address]
                result = run_sweep(hub, work, extra)
            finally:
                if session is not None:
                    stop_ray(session, work / "ray")
                shutil.rmtree(work, ignore_errors=True)
            rows.append((mode, result))
            print(f"{mode}: {result['summary']}", flush=True)
    finally:
        hub.stop()

    print()
    print("| pool | targets | distinct configs (analyses) | dedup ratio | failed | wall s | targets/s | Hub requests (list/HEAD/GET) |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, r in rows:
        req = r["requests"]
        print(f"| {mode} | {r['targets']} | {r['distinct']} ({r['analysed']}) | {r['targets'] / max(1, r['analysed']):.0f}x | {r['failed']} | "
              f"{r['wall_s']:.1f} | {r['targets'] / r['wall_s']:.0f} | {req.get('list', 0)}/{req.get('head', 0)}/{req.get('get', 0)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
