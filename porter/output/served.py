"""How vLLM serves a model folder: the port's last word, from hfcheck's own scan.

- ``vllm-native``: the architecture is in vLLM's registry, so ``vllm serve DIR`` (model-impl
  ``auto``) uses vLLM's own implementation (what a retarget to Falcon, Llama or Qwen2 aims at);
- ``transformers-backend``: vLLM serves it through ``--model-impl transformers`` at the
  scan's verdict (native-speed or runs);
- ``not-served``: neither (the scan's blockers say why).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.analyzer.sources import resolve
from hfcheck.analyzer.sources.processor_files import tokenizer_needs_remote_code


@dataclass
class Served:
    how: str
    summary: str
    command: str | None
    verdict: str
    score: int
    blockers: list[str] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def served(self) -> bool:
        return self.how != "not-served"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("report")
        return out


def how_served(folder: Path, *, trust_remote_code: bool = False) -> Served:
    from hfcheck.analyzer.scan import scan

    source = resolve(str(folder))
    report = scan(source, trust_remote_code=trust_remote_code).report
    model = report["model"]
    arch = (model.get("architectures") or ["?"])[0]
    verdict, score = report["verdict"], report["score"]
    remote_tokenizer = tokenizer_needs_remote_code(folder)
    if model.get("vllm_native"):
        cmd = f"vllm serve {folder}" + (" --trust-remote-code" if remote_tokenizer or model.get("remote_code") else "")
        backend = "also through the transformers backend" if verdict in ("native-speed", "runs") else "not through the transformers backend"
        summary = (f"vLLM {report['vllm_version_modelled']} serves {arch} with its own implementation (native; "
                   f"{backend}: {verdict} {score}/100)")
        return Served("vllm-native", summary, cmd, verdict, score, list(report["blockers"]), report)
    if verdict in ("native-speed", "runs"):
        command: str | None = report.get("serve_command")
        if command and remote_tokenizer and "--trust-remote-code" not in command:
            command += " --trust-remote-code"
        summary = f"vLLM serves {arch} through its transformers backend: {verdict}, {score}/100"
        return Served("transformers-backend", summary, command, verdict, score, [], report)
    why = "; ".join(report["blockers"]) or f"verdict {verdict}"
    return Served("not-served", f"vLLM serves {arch} neither natively nor through its transformers backend: {why}", None, verdict, score,
                  list(report["blockers"]), report)


def how_served_config(config: dict[str, Any]) -> Served:
    """``how_served`` for a bare config (a retarget candidate at the shrunk size)."""

    with tempfile.TemporaryDirectory(prefix="hfcheck-served-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config), encoding="utf-8")
        return how_served(Path(tmp))
