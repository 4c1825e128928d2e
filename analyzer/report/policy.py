"""A policy file: which checks enforce, which are ignored, and the score gate.

Model authors keep one beside their model and pass it with ``hfcheck scan --policy FILE``.
TOML (``.toml``) or YAML (``.yaml`` / ``.yml``); the keys, all optional:

```toml
# hfcheck-policy.toml
fail-under = 80                     # exit 1 when the (policy) score is below 80; --fail-under wins
enforce = ["HFC1*", "HFC2*", "HFC800"]   # only these fail the run (default: every check)
ignore = ["HFC103", "HFC5*"]        # dropped from the output, the exit status and the score
fail-on = ["fail", "inconclusive"]  # statuses of enforced checks that fail the run (default: ["fail"])
```

The same keys may sit under a ``[hfcheck]`` table (or an ``hfcheck:`` mapping in YAML), and
``_`` may replace ``-``. A pattern is a check code (``HFC201``) or a glob (``HFC2*``,
``HFC8??``); matching ignores case. ``ignore`` wins over ``enforce``.

What a policy changes:
- ignored checks leave ``checks`` and ``code_findings`` (``report["policy"]["ignored"]`` lists
  them), so no renderer shows them and they cost no score;
- a failing check that is not enforced is still reported, as a warning (SARIF level
  ``warning``, ``::warning`` annotation), and does not fail the run;
- ``report["policy"]["score"]`` is the score recomputed without the ignored checks (the same
  rules as ``report["score"]``, ``analyzer/report/verdict.py``, failed proofs included, which stays
  hfcheck's unfiltered prediction); the ``fail-under`` gate reads the policy score.

The verdict is never changed: it is a statement about vLLM, not about the policy.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfcheck.analyzer.report.verdict import judge
from hfcheck.analyzer.rules.registry import BY_CODE
from hfcheck.shared.command import EXIT_CLEAN, EXIT_FINDINGS

STATUSES = ("pass", "fail", "warn", "info", "inconclusive")
KEYS = ("fail-under", "enforce", "ignore", "fail-on")


class PolicyError(Exception):
    """A policy file that cannot be read or is malformed; str() is one line."""


@dataclass(frozen=True)
class Policy:
    enforce: tuple[str, ...] | None = None  # None: every check enforces
    ignore: tuple[str, ...] = ()
    fail_under: int | None = None
    fail_on: frozenset[str] = field(default_factory=lambda: frozenset({"fail"}))
    source: str | None = None

    def ignores(self, code: str) -> bool:
        return _matches(code, self.ignore)

    def enforces(self, code: str) -> bool:
        if self.ignores(code):
            return False
        return True if self.enforce is None else _matches(code, self.enforce)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "enforce": list(self.enforce) if self.enforce is not None else None,
            "ignore": list(self.ignore),
            "fail_under": self.fail_under,
            "fail_on": sorted(self.fail_on),
        }

    def apply(self, report: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``report`` with ignored checks removed and a ``policy`` block added."""
        out = copy.deepcopy(report)
        ignored = sorted({c["code"] for c in out.get("checks", []) if self.ignores(c["code"])}
                         | {c["code"] for c in out.get("code_findings") or [] if self.ignores(c["code"])})
        out["checks"] = [c for c in out.get("checks", []) if not self.ignores(c["code"])]
        if "code_findings" in out and out["code_findings"] is not None:
            out["code_findings"] = [c for c in out["code_findings"] if not self.ignores(c["code"])]
        out["policy"] = {**self.to_dict(), "ignored": ignored, "score": policy_score(out["checks"], out.get("proofs") or ())}
        return out

    def exit_code(self, report: dict[str, Any], fail_under: int | None = None) -> int:
        """0 clean, 1 when an enforced check has a ``fail-on`` status, a proof failed, or the
        score is under the gate (``fail_under`` from the command line wins over the file's)."""
        gate = fail_under if fail_under is not None else self.fail_under
        score = (report.get("policy") or {}).get("score", report.get("score", 100))
        if gate is not None and score < gate:
            return EXIT_FINDINGS
        if any(p.get("status") == "failed" for p in report.get("proofs", [])):
            return EXIT_FINDINGS
        for c in report.get("checks", []):
            if self.enforces(c["code"]) and c["status"] in self.fail_on:
                return EXIT_FINDINGS
        return EXIT_CLEAN


DEFAULT_POLICY = Policy()


def _matches(code: str, patterns: Iterable[str]) -> bool:
    code = code.upper()
    return any(fnmatch.fnmatchcase(code, p.upper()) for p in patterns)


def enforced(report: dict[str, Any], code: str) -> bool:
    """Whether a failure of ``code`` fails the run under the report's policy (no policy: yes)."""
    block = report.get("policy")
    if not block:
        return True
    if _matches(code, block.get("ignore") or ()):
        return False
    patterns = block.get("enforce")
    return True if patterns is None else _matches(code, patterns)


def policy_score(checks: list[dict[str, Any]], proofs: Iterable[Any] = ()) -> int:
    """The score of the checks a policy keeps, with the report's proofs (``analyzer/report/verdict.py``)."""

    return judge(checks, proofs)[1]


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise PolicyError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            try:
                import tomli as tomllib
            except ModuleNotFoundError:
                raise PolicyError(f"{path}: reading TOML needs Python 3.11+ (or the tomli package); use a .yaml policy") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{path}: not valid TOML: {exc}") from None
    raise PolicyError(f"{path}: a policy file ends in .toml, .yaml or .yml")


def _patterns(path: Path, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise PolicyError(f"{path}: {key} must be a list of check codes or globs such as \"HFC2*\"")

    out = []
    for v in value:
        v = v.strip().upper()
        if not any(ch in v for ch in "*?[") and not (v.startswith("HFC") and v[3:].isdigit() and len(v) == 6):
            raise PolicyError(f"{path}: {key}: {v!r} is not a check code (HFCnnn) or a glob")
        if not any(ch in v for ch in "*?[") and v not in BY_CODE:
            raise PolicyError(f"{path}: {key}: unknown check code {v} (`hfcheck explain --all` lists them)")
        out.append(v)
    return tuple(out)


def parse_policy(data: Any, path: Path | str = "<policy>") -> Policy:
    path = Path(path)
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: a policy is a table of keys ({', '.join(KEYS)})")
    if isinstance(data.get("hfcheck"), dict):
        data = data["hfcheck"]
    norm = {str(k).replace("_", "-"): v for k, v in data.items()}
    unknown = sorted(set(norm) - set(KEYS))
    if unknown:
        raise PolicyError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    fail_under = norm.get("fail-under")
    if fail_under is not None and (isinstance(fail_under, bool) or not isinstance(fail_under, int) or not 0 <= fail_under <= 100):
        raise PolicyError(f"{path}: fail-under must be an integer from 0 to 100")
    fail_on = norm.get("fail-on", ["fail"])
    if isinstance(fail_on, str):
        fail_on = [fail_on]
    if not isinstance(fail_on, list) or not fail_on or any(s not in ("fail", "warn", "inconclusive") for s in fail_on):
        raise PolicyError(f"{path}: fail-on must list statuses among fail, warn, inconclusive")
    enforce = _patterns(path, "enforce", norm["enforce"]) if "enforce" in norm else None
    ignore = _patterns(path, "ignore", norm["ignore"]) if "ignore" in norm else ()
    return Policy(enforce=enforce, ignore=ignore, fail_under=fail_under, fail_on=frozenset(fail_on), source=str(path))


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; ``PolicyError`` (one line) when it is not usable."""
    path = Path(path)
    return parse_policy(_read(path), path)
