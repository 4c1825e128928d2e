"""Model lists from the Hub (``--hub-search``, ``--author``, ``hub:QUERY``) and one analysis per config.

Listing and reading configs go through huggingface_hub against a Hub-compatible endpoint on
127.0.0.1 (``tests/hub_endpoint.py``, set as HF_ENDPOINT in the sweep's process); nothing reaches
the real Hub. The sweeps are real: worker processes, the result cache, the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_endpoint import Hub, hub_env
from leftovers import no_leftover_processes  # noqa: F401 - autouse: a leaked process fails its own test only

from hfcheck.analyzer.sources.model_types import TargetError
from hfcheck.sweep.hub import HubQuery, parse_query

BUNDLED = Path(__file__).resolve().parents[1] / "analyzer" / "data" / "bundled"
SMALL = json.loads((BUNDLED / "Qwen__Qwen3-0.6B" / "config.json").read_text())
LARGER = json.loads((BUNDLED / "Qwen__Qwen3-4B" / "config.json").read_text())


def finetune(config: dict, name: str) -> dict:
    """What a fine-tune's config.json usually differs in: who saved it, with which transformers."""
    return {**config, "_name_or_path": name, "transformers_version": "5.1.0"}


@pytest.fixture(scope="module")
def hub():
    hub = Hub()
    hub.add("acme/base-small", SMALL, downloads=900)
    for i in range(4):
        hub.add(f"acme/small-ft-{i}", finetune(SMALL, f"acme/small-ft-{i}"), downloads=800 - i)
    hub.add("acme/base-larger", LARGER, downloads=500)
    hub.add("acme/larger-ft", finetune(LARGER, "acme/larger-ft"), downloads=400)
    hub.add("acme/small-embedder", SMALL, downloads=10_000, pipeline_tag="feature-extraction")
    hub.add("acme/small-gguf", SMALL, downloads=5_000, tags=("gguf",))
    hub.add("other/small-ft", finetune(SMALL, "other/small-ft"), downloads=50)
    hub.add("late/small-ft", finetune(SMALL, "late/small-ft"), downloads=1)  # met by a later sweep only
    hub.start()
    yield hub
    hub.stop()


def sweep(tmp_path: Path, hub: Hub, *args: str, cache: str = "cache") -> subprocess.CompletedProcess:
    env = hub_env(os.environ, hub.url, tmp_path)
    env["HFCHECK_CACHE_DIR"] = str(tmp_path / cache)
    return subprocess.run([sys.executable, "-m", "hfcheck.sweep", *args, "--format", "json", "--jobs", "1"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def without_timings(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "timings_s"}


def test_query_syntax():
    q = parse_query("qwen3 chat author=Qwen library=transformers filter=a filter=b sort=likes limit=all")
    assert (q.search, q.author, q.library, q.filters, q.sort, q.limit, q.pipeline_tag) == ("qwen3 chat", "Qwen", "transformers", ("a", "b"), "likes", None, "text-generation")
    assert parse_query("pipeline_tag=any limit=5", HubQuery(limit=7)).pipeline_tag is None
    assert parse_query("", HubQuery(limit=7, sort=None)) == HubQuery(limit=7, sort=None)
    for bad, message in (("colour=red", "unknown key 'colour'"), ("limit=0", "at least 1"), ("sort=size", "sort must be one of"), ("'open", "quotation")):
        with pytest.raises(TargetError, match=message):
            parse_query(bad)


def test_author_search_and_from_go_through_the_listing_api_with_filters(tmp_path, hub):
    from hfcheck.sweep.hub import (
        list_refs,  # in a child: huggingface_hub reads HF_ENDPOINT at import
    )

    code = ("import json, sys; from hfcheck.sweep.hub import HubQuery, list_refs, parse_query\n"
            "print(json.dumps([list_refs(parse_query(q, HubQuery()), label=q) for q in sys.argv[1:]]))")
    queries = ["author=acme", "small library=transformers limit=3", "small pipeline_tag=any sort=downloads limit=2", "ft author=other"]
    run = subprocess.run([sys.executable, "-c", code, *queries], capture_output=True, text=True, env=hub_env(os.environ, hub.url, tmp_path), timeout=120)
    assert run.returncode == 0, run.stderr
    by_author, search, any_tag, other = json.loads(run.stdout)
    # text-generation only (the embedder is not), most downloaded first; gguf is a library filter away
    assert by_author == ["acme/small-gguf", "acme/base-small", "acme/small-ft-0", "acme/small-ft-1", "acme/small-ft-2", "acme/small-ft-3",
                         "acme/base-larger", "acme/larger-ft"]
    assert search == ["acme/base-small", "acme/small-ft-0", "acme/small-ft-1"]
    assert any_tag == ["acme/small-embedder", "acme/small-gguf"]
    assert other == ["other/small-ft"]
    assert list_refs is not None


def test_identical_configs_are_analysed_once_and_named_as_themselves(tmp_path, hub):
    listing = tmp_path / "models.txt"
    listing.write_text("# the acme catalogue, and one more\nhub: author=acme library=transformers\nother/small-ft\n")
    first = sweep(tmp_path, hub, "--from", str(listing))
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    small = ["acme/base-small", "acme/small-ft-0", "acme/small-ft-1", "acme/small-ft-2", "acme/small-ft-3", "other/small-ft"]
    assert list(out) == ["acme/base-small", *small[1:5], "acme/base-larger", "acme/larger-ft", "other/small-ft"]
    # eight repositories, two configs: two analyses
    assert "8 of 8 targets" in first.stderr and "(2 analysed, 0 from cache, 0 failed, 6 answered by an identical config; 2 distinct configs" in first.stderr, first.stderr
    assert len({out[k]["config_hash"] for k in small}) == 1 and out["acme/base-larger"]["config_hash"] == out["acme/larger-ft"]["config_hash"]
    assert out["acme/base-small"]["config_hash"] != out["acme/base-larger"]["config_hash"]
    for key in out:  # each is named as itself, as if it had been analysed alone
        assert out[key]["model"]["ref"] == key and out[key]["model"]["source"] == "hub"
        assert out[key]["serve_command"].startswith(f"vllm serve {key} --model-impl transformers")
        assert out[key]["model"]["revision"] == hub.repos[key].sha
    # ... and it is: a fine-tune analysed on its own gives the same report (timings aside)
    alone = sweep(tmp_path, hub, "acme/small-ft-2", "--no-cache")
    assert without_timings(json.loads(alone.stdout)["acme/small-ft-2"]) == without_timings(out["acme/small-ft-2"])

    # a later sweep meets a new fine-tune of the same base: answered from the cache, no analysis
    again = sweep(tmp_path, hub, "--author", "acme", "--author", "late", "--limit", "all", "--library", "transformers")
    assert again.returncode == 0, again.stderr
    # the first of each config from the cache, the rest answered by it
    assert "8 of 8 targets" in again.stderr and "(0 analysed, 4 from cache, 0 failed, 4 answered by an identical config; 2 distinct configs)" in again.stderr, again.stderr
    new = json.loads(again.stdout)["late/small-ft"]
    assert new["model"]["ref"] == "late/small-ft" and new["config_hash"] == out["acme/base-small"]["config_hash"]
    assert without_timings(new) == {**without_timings(out["acme/small-ft-0"]), "model": new["model"], "serve_command": new["serve_command"]}


def test_hub_queries_offline_are_one_clear_error(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HFCHECK_CACHE_DIR": str(tmp_path / "cache")}
    for args in (["--hub-search", "qwen3 limit=5"], ["--author", "Qwen"], ["--from", "hub:author=Qwen"]):
        run = subprocess.run([sys.executable, "-m", "hfcheck.sweep", *args], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert run.returncode == 2, run.stderr
        line, = run.stderr.strip().splitlines()
        assert line.startswith("hfcheck: error: hub:") and "the Hub cannot be reached (HF_HUB_OFFLINE=1)" in line, line
    run = subprocess.run([sys.executable, "-m", "hfcheck.sweep", "--hub-search", "x colour=red"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "unknown key 'colour'" in run.stderr
