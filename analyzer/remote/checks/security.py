"""Security red flags, HFC820-825: dynamic code, processes, network, unsafe deserialization,
file writes, import-time side effects. A red flag that runs on import fails; inside a function it warns."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from hfcheck.analyzer.remote.ast_helpers import call_kw, location_status, where_in
from hfcheck.analyzer.remote.checks.base import CodeFinding, RemoteCodeRule
from hfcheck.analyzer.remote.index import CodeIndex, FileIndex, is_main_guard

# --------------------------------------------------------------------------- HFC820-825: security


_EXEC = {"exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile", "__import__", "builtins.__import__"}
_PROCESS_EXACT = {"os.system", "os.popen", "os.fork", "os.forkpty", "os.startfile", "pty.spawn", "commands.getoutput", "commands.getstatusoutput", "platform.popen"}
_PROCESS_PREFIX = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "asyncio.create_subprocess")
_NETWORK_MODULES = ("socket", "requests", "urllib.request", "urllib3", "http.client", "httpx", "aiohttp", "websocket", "websockets", "ftplib", "smtplib", "telnetlib", "paramiko", "pycurl", "xmlrpc.client")
_HUB_DOWNLOADS = ("hf_hub_download", "snapshot_download", "cached_download", "hf_hub_url")
_DESERIALIZE = {"pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "cPickle.load", "cPickle.loads", "dill.load", "dill.loads",
                "cloudpickle.load", "cloudpickle.loads", "joblib.load", "marshal.load", "marshal.loads", "shelve.open", "pandas.read_pickle", "numpy.load", "torch.load"}
_FILE_OPS = {"shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.make_archive", "shutil.unpack_archive", "shutil.chown",
             "os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.rename", "os.renames", "os.replace", "os.makedirs", "os.mkdir", "os.chmod", "os.chown",
             "os.symlink", "os.link", "os.truncate", "torch.save", "numpy.save", "numpy.savez", "numpy.savetxt", "pathlib.Path.write_text"}
_WRITE_METHODS = ("write_text", "write_bytes", "unlink", "rmdir", "rename", "touch", "symlink_to")


def _network_module(dotted: str) -> str | None:
    for m in _NETWORK_MODULES:
        if dotted == m or dotted.startswith(m + "."):
            return m
    return None


def _path_allowed(file: FileIndex, call: ast.Call, path: ast.expr | None) -> bool:
    """Writes into a cache/temp location, or to a path the caller passed in, are expected."""
    if path is None:
        return False
    if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(("/", "~", "\\")) for n in ast.walk(path)):
        return False  # an absolute location, whatever is joined to it
    func = file.enclosing_function(call)
    params = {a.arg for a in (func.args.args + func.args.kwonlyargs + func.args.posonlyargs)} if func else set()
    for node in ast.walk(path):
        token = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if token is None:
            continue
        if isinstance(node, ast.Name) and token in params - {"self", "cls"}:
            return True
        low = str(token).lower()
        if "cache" in low or "tempfile" in low or "tmpdir" in low or "temp_dir" in low or "mkdtemp" in low:
            return True
    return False


def _open_writes(call: ast.Call) -> bool | None:
    mode = call_kw(call, "mode", 1)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(ch in mode.value for ch in "wax+")
    return None  # unknown mode


def classify_call(file: FileIndex, call: ast.Call) -> tuple[str, str] | None:
    """(code, description) for a security-relevant call, else None."""
    name = file.call_name(call) or ""
    method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if name in _EXEC:
        return "HFC820", f"{name}()"
    if name == "importlib.import_module" and call.args and not isinstance(call.args[0], ast.Constant):
        return "HFC820", "importlib.import_module() of a computed name"
    if name == "getattr" and call.args and (file.dotted(call.args[0]) or "") in ("builtins", "__builtins__"):
        return "HFC820", "getattr(builtins, ...) (reaches exec/eval indirectly)"
    if name in _PROCESS_EXACT or name.startswith(_PROCESS_PREFIX):
        return "HFC821", f"{name}()"
    if (module := _network_module(name)) is not None:
        return "HFC822", f"{name}() ({module})"
    if name.rpartition(".")[2] in _HUB_DOWNLOADS and (name.startswith("huggingface_hub") or "." not in name or name.startswith(".")):
        return "HFC822", f"{name}() (downloads from the Hub at run time)"
    if name in _DESERIALIZE:
        if name == "torch.load":
            weights_only = call_kw(call, "weights_only")
            if isinstance(weights_only, ast.Constant) and weights_only.value is True:
                return None
            why = "weights_only=False" if weights_only is not None else "no weights_only=True (safe only where torch >= 2.6 defaults it)"
            return "HFC823", f"torch.load() with {why}"
        if name == "numpy.load":
            allow = call_kw(call, "allow_pickle")
            if not (isinstance(allow, ast.Constant) and allow.value is True):
                return None
            return "HFC823", "numpy.load(allow_pickle=True)"
        return "HFC823", f"{name}() (unpickles arbitrary objects)"
    if name in ("open", "io.open", "builtins.open", "os.open", "codecs.open"):
        writes = _open_writes(call) if name != "os.open" else None
        if writes is False and name != "os.open":
            return None
        if name == "os.open":
            flags = call_kw(call, "flags", 1)
            attrs = {n.attr for n in ast.walk(flags) if isinstance(n, ast.Attribute)} if flags is not None else set()
            if attrs and not attrs & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}:
                return None
            writes = True if attrs else None
        if _path_allowed(file, call, call_kw(call, "file", 0)):
            return None
        target = ast.unparse(call.args[0]) if call.args else "?"
        return "HFC824", f"{name}({target}, {'write mode' if writes else 'unknown mode'})"
    if name in _FILE_OPS or name.startswith("shutil."):
        dest = call_kw(call, "dst", 1) if name.startswith(("shutil.copy", "shutil.move", "os.rename", "os.replace")) else (call.args[0] if call.args else None)
        if name in ("torch.save", "numpy.save", "numpy.savez", "numpy.savetxt"):
            dest = call_kw(call, "f", 1) if name == "torch.save" else (call.args[0] if call.args else None)
        if _path_allowed(file, call, dest):
            return None
        return "HFC824", f"{name}()"
    if method in _WRITE_METHODS and isinstance(call.func, ast.Attribute) and not name.startswith("self."):
        if _path_allowed(file, call, call.func.value):
            return None
        return "HFC824", f".{method}() on {ast.unparse(call.func.value)}"
    return None


_SECURITY_TEXT = {
    "HFC820": ("runs dynamically built code", "Remove exec/eval/compile: parse values with int()/float()/json.loads and import modules by name."),
    "HFC821": ("starts a process", "Remove process execution from modeling code; nothing in a model's forward or load path needs a shell."),
    "HFC822": ("reaches the network", "Remove network access; ship needed files in the repo so they are fetched with the model."),
    "HFC823": ("deserializes with pickle", "Load tensors with safetensors, or torch.load(..., weights_only=True)."),
    "HFC824": ("writes files outside the cache", "Write only under the HF cache or a caller-given directory (save_pretrained), never to fixed or computed paths."),
}


def check_security(index: CodeIndex) -> Iterator[CodeFinding]:
    counts = {code: 0 for code in (*_SECURITY_TEXT, "HFC825")}
    for file in index.files.values():
        if file.tree is None:
            continue
        for imp in file.imports:
            module = _network_module(imp.qualified if imp.name else imp.module) or _network_module(imp.module)
            if module is None:
                continue
            counts["HFC822"] += 1
            yield CodeFinding("HFC822", "warn", file.path, imp.line, f"imports {imp.qualified} (network: {module})", _SECURITY_TEXT["HFC822"][1])
        flagged_lines: set[int] = set()
        for node in ast.walk(file.tree):
            if not isinstance(node, ast.Call):
                continue
            hit = classify_call(file, node)
            if hit is None:
                continue
            code, what = hit
            counts[code] += 1
            flagged_lines.add(node.lineno)
            where = where_in(file, node)
            yield CodeFinding(code, location_status(file, node), file.path, node.lineno, f"{what} {where}: {_SECURITY_TEXT[code][0]}".replace("  ", " "), _SECURITY_TEXT[code][1])
        for finding in _side_effects(file, flagged_lines):
            counts["HFC825"] += 1
            yield finding
    for code, n in counts.items():
        if not n:
            yield CodeFinding(code, "pass", None, None, _PASS_TEXT[code])


_PASS_TEXT = {
    "HFC820": "no exec / eval / compile",
    "HFC821": "no process execution",
    "HFC822": "no network access",
    "HFC823": "no pickle-based loading",
    "HFC824": "no file writes outside the cache",
    "HFC825": "no import-time side effects",
}

_SAFE_CALL_PREFIXES = ("logging.", "warnings.", "typing.", "collections.", "dataclasses.", "functools.", "re.", "enum.")
_SAFE_CALLS = {"torch.fx.wrap", "print"}


def _side_effects(file: FileIndex, flagged_lines: set[int]) -> Iterator[CodeFinding]:
    """HFC825: statements that do something when the file is merely imported."""
    defined = set(file.module_assigns) | set(file.classes) | set(file.functions)
    modules = {local for local, origin in file.aliases.items() if not origin.startswith(".")}

    def visit(stmts: list[ast.stmt]) -> Iterator[CodeFinding]:
        for stmt in stmts:
            if stmt.lineno in flagged_lines:
                continue
            if isinstance(stmt, ast.If):
                if not is_main_guard(stmt.test):
                    yield from visit(stmt.body)
                yield from visit(stmt.orelse)
                continue
            if isinstance(stmt, ast.Try):
                yield from visit(stmt.body)
                for h in stmt.handlers:
                    yield from visit(h.body)
                yield from visit(stmt.orelse)
                yield from visit(stmt.finalbody)
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                yield CodeFinding("HFC825", "warn", file.path, stmt.lineno, f"a module-level `{type(stmt).__name__.lower()}` runs when the file is imported",
                                  "Move work out of module level into functions the model calls.")
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                name = file.call_name(stmt.value) or ast.unparse(stmt.value.func)
                first = name.split(".")[0]
                method = name.rpartition(".")[2]
                if (
                    name in _SAFE_CALLS
                    or name.startswith(_SAFE_CALL_PREFIXES)
                    or first in ("logger", "log", "_logger")
                    or method in ("register", "register_for_auto_class")
                    or (first in defined and first not in modules)
                ):
                    continue
                yield CodeFinding("HFC825", "warn", file.path, stmt.lineno, f"calls {name}() at import time",
                                  "Do not change global state when the file is imported; do it inside the model, or not at all.")
                continue
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, (ast.Attribute, ast.Subscript)):
                        root: ast.expr = t
                        while isinstance(root, (ast.Attribute, ast.Subscript)):
                            root = root.value
                        if isinstance(root, ast.Name) and root.id in modules:
                            yield CodeFinding("HFC825", "warn", file.path, stmt.lineno, f"assigns {ast.unparse(t)} at import time (changes another module's state)",
                                              "Do not patch other modules or the environment from modeling code.")
                            break

    if file.tree is not None:  # the caller reads only files that parsed
        yield from visit(file.tree.body)


# --------------------------------------------------------------------------- the codes, documented


class DynamicCodeExecution(RemoteCodeRule):
    code = "HFC820"
    name = "remote-dynamic-code"
    impact = "info"
    what = "exec / eval / compile, __import__, importlib.import_module of a computed name, getattr on builtins."
    why = "Code that builds code can do anything and hides what it does from review and from static analysis. At import time (fail) it runs as soon as transformers loads the model."
    example = 'use_triton = eval(os.environ.get("use_triton", "False"))'
    fix = "Parse values explicitly (int(), float(), json.loads, a dict of allowed names); import modules by name."
    none = None


class ProcessExecution(RemoteCodeRule):
    code = "HFC821"
    name = "remote-process-execution"
    impact = "info"
    what = "subprocess, os.system, os.popen, os.exec*/spawn*/fork, pty.spawn."
    why = "Modeling code has no reason to start processes; doing so at import time (fail) runs commands on every machine that loads the model."
    example = 'os.system("pip install flash-attn")'
    fix = "Remove it; declare dependencies in the model card instead of installing them from code."
    none = None


class NetworkAccess(RemoteCodeRule):
    code = "HFC822"
    name = "remote-network-access"
    impact = "info"
    what = "Imports and calls of socket, requests, urllib.request, http.client, httpx, aiohttp, websockets, ftplib, smtplib, paramiko; run-time Hub downloads."
    why = "Network access from modeling code can exfiltrate data or fetch code that was never reviewed; at import time (fail) it happens on every load, and offline deployments break."
    example = "requests.post(url, data=open(os.path.expanduser('~/.cache/huggingface/token')).read())"
    fix = "Ship every file the model needs in its repo; never open connections from modeling code."
    none = None


class UnsafeDeserialization(RemoteCodeRule):
    code = "HFC823"
    name = "remote-unsafe-deserialization"
    impact = "info"
    what = "pickle / dill / joblib / marshal loads, numpy.load(allow_pickle=True), torch.load without weights_only=True."
    why = "Unpickling executes arbitrary code embedded in the file; a repo can ship a tensor file that runs a payload when the model loads it."
    example = "state = torch.load(path)   # weights_only defaults to True only on torch >= 2.6"
    fix = "Use safetensors, or torch.load(path, weights_only=True)."
    none = None


class FileWrites(RemoteCodeRule):
    code = "HFC824"
    name = "remote-file-writes"
    impact = "info"
    what = "open(..., 'w'/'a'/'x'/'+') and os/shutil/pathlib writes, moves and deletions to fixed or computed paths (not a cache, temp or caller-given directory)."
    why = "Modeling code should write only under the HF cache or where the caller asks (save_pretrained); writes elsewhere can plant files or destroy data, at import time (fail) on every load."
    example = 'open(os.path.expanduser("~/.bashrc"), "a").write(...)'
    fix = "Write only under a directory the caller passes in, or the HF cache."
    none = None


class ImportTimeSideEffects(RemoteCodeRule):
    code = "HFC825"
    name = "remote-import-time-side-effects"
    impact = "info"
    what = "Module-level statements that act when the file is merely imported: calls (other than logging/warnings/registration), loops, `with` blocks, assignments into other modules (os.environ, torch flags)."
    why = "transformers imports the module to get one class; anything it does at import happens in every process that loads the model (vLLM workers included), before any check."
    example = 'os.environ["CUDA_VISIBLE_DEVICES"] = "0"\ntorch.backends.cuda.matmul.allow_tf32 = True'
    fix = "Move the work into the model's __init__/forward, or drop it."
    none = None


RULES = (DynamicCodeExecution, ProcessExecution, NetworkAccess, UnsafeDeserialization, FileWrites, ImportTimeSideEffects,)
