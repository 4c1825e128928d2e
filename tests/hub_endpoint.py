"""A Hub-compatible HTTP endpoint on 127.0.0.1 for listing and reading many repositories.

Serves what ``huggingface_hub`` asks of the Hub for ``list_models`` and ``hf_hub_download``:

- ``GET /api/models?search=&author=&filter=&pipeline_tag=&sort=&direction=&limit=`` -> a JSON page
  of models, filtered and sorted as the Hub does it (``filter`` and a library are tags), with a
  ``Link: <...>; rel="next"`` header to the next page (at most ``PAGE`` models a page);
- ``HEAD|GET /<org>/<name>/resolve/<revision>/<file>`` -> the file, with the headers
  ``hf_hub_download`` reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``), or the Hub's
  error codes (``X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound``).

Used by tests (set ``HF_ENDPOINT`` to ``Hub.url`` in the process that lists or resolves) and by
``benchmarks/bench_sweep_scale.py`` (ten thousand synthetic repositories). Nothing reaches the
real Hub. ``Hub.requests`` counts what was asked, per kind.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

PAGE = 1000


@dataclass
class Repo:
    repo_id: str
    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    pipeline_tag: str | None = "text-generation"
    tags: tuple[str, ...] = ("transformers",)
    sha: str = ""
    created: str = "2026-01-01T00:00:00.000Z"

    def __post_init__(self) -> None:
        if not self.sha:
            self.sha = hashlib.sha1(self.repo_id.encode()).hexdigest()

    def listing(self) -> dict:
        library = next((t for t in self.tags if t in ("transformers", "gguf", "diffusers", "mlx")), None)
        return {"_id": self.sha[:24], "id": self.repo_id, "modelId": self.repo_id, "downloads": self.downloads, "likes": self.likes,
                "pipeline_tag": self.pipeline_tag, "library_name": library, "tags": list(self.tags), "private": False,
                "createdAt": self.created}


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def add(self, repo_id: str, config: dict, **kw) -> Repo:
        repo = Repo(repo_id, {"config.json": json.dumps(config).encode()}, **kw)
        self.repos[repo_id] = repo
        return repo

    # -- the listing, as the Hub answers it
    def select(self, query: dict[str, list[str]]) -> list[Repo]:
        one = {k: v[-1] for k, v in query.items()}
        found = list(self.repos.values())
        if one.get("search"):
            needle = one["search"].lower()
            found = [r for r in found if needle in r.repo_id.lower()]
        if one.get("author"):
            found = [r for r in found if r.repo_id.split("/", 1)[0] == one["author"]]
        if one.get("pipeline_tag"):
            found = [r for r in found if r.pipeline_tag == one["pipeline_tag"]]
        for tag in query.get("filter", []):
            found = [r for r in found if tag in r.tags]
        sort = one.get("sort")
        if sort in ("downloads", "likes"):
            found.sort(key=lambda r: getattr(r, sort), reverse=one.get("direction", "-1") == "-1")
        elif sort == "createdAt":
            found.sort(key=lambda r: r.created, reverse=True)
        return found

    def start(self) -> Hub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: huggingface_hub reuses its connections

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, with_body: bool = True) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body and body:
                    self.wfile.write(body)

            def _listing(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                hub.requests["list"] += 1
                found = hub.select(query)
                offset = int(query.get("cursor", ["0"])[-1])
                size = min(int(query.get("limit", [PAGE])[-1]), PAGE)
                page = found[offset : offset + size]
                headers = {"Content-Type": "application/json"}
                if offset + size < len(found):
                    nxt = {k: v for k, v in query.items() if k != "cursor"}
                    nxt["cursor"] = [str(offset + size)]
                    headers["Link"] = f'<{hub.url}/api/models?{urlencode(nxt, doseq=True)}>; rel="next"'
                self._send(200, json.dumps([r.listing() for r in page]).encode(), headers)

            def _file(self, with_body: bool) -> None:
                parts = unquote(urlsplit(self.path).path).strip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._send(404, headers={"X-Error-Code": "RepoNotFound"}, with_body=with_body)
                repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                hub.requests["head" if not with_body else "get"] += 1
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._send(401, headers={"X-Error-Code": "RepoNotFound"}, with_body=with_body)
                if revision not in ("main", repo.sha):
                    return self._send(404, headers={"X-Error-Code": "RevisionNotFound", "X-Repo-Commit": repo.sha}, with_body=with_body)
                data = repo.files.get(filename)
                if data is None:
                    return self._send(404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.sha}, with_body=with_body)
                headers = {"X-Repo-Commit": repo.sha, "ETag": '"%s"' % hashlib.sha1(data).hexdigest()}
                self._send(200, data, headers, with_body=with_body)

            def do_GET(self) -> None:
                if self.path.startswith("/api/models"):
                    self._listing()
                else:
                    self._file(with_body=True)

            def do_HEAD(self) -> None:
                self._file(with_body=False)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def hub_env(base: dict, hub_url: str, root) -> dict:
    """An environment in which huggingface_hub talks to ``hub_url`` only, with caches under ``root``."""
    env = {k: v for k, v in base.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=hub_url, HF_HOME=str(root / "hf"), HF_HUB_CACHE=str(root / "hf" / "hub"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_ETAG_TIMEOUT="30", HF_HUB_DOWNLOAD_TIMEOUT="30")
    return env
