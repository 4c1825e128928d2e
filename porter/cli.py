"""``hfcheck port SRC --out DIR [--serve]`` and ``hfcheck serve DIR``.

Wiring (hfcheck/cli.py): ``add_parser(sub)`` in ``build_parser``; in ``main``:
``if args.command in ("port", "serve"): return run(args)``.

Exit codes follow ``scan``: 0 ported and proven (or nothing to port; served and matching),
1 refused, not proven, or the smoke-serve failed, 2 hfcheck could not run (bad reference,
unusable output folder, bad usage).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hfcheck.shared.command import EXIT_CLEAN, EXIT_FINDINGS, Parser, fail, interrupted

TP2 = {"auto": None, "yes": True, "no": False}
"""--tp2 as smoke_serve takes it (None: when hfcheck predicts TP 2 loads and there are 2 cores)."""


def add_parser(subparsers) -> None:
    port = subparsers.add_parser("port", help="rewrite a remote-code model into one vLLM's transformers backend serves, prove it, write a model folder")
    port.add_argument("src", help="local model folder (or Hub id) with config.json and its auto_map code")
    port.add_argument("--out", metavar="DIR", help="output folder (created; must be empty unless --force)")
    port.add_argument("--format", choices=("text", "json"), default="text")
    port.add_argument("--serve", action="store_true", help="then smoke-serve the ported folder (hfcheck serve)")
    port.add_argument("--tp2", choices=("auto", "yes", "no"), default="auto",
                      help="with --serve: also serve at tensor-parallel size 2, as hfcheck serve --tp2 does")
    port.add_argument("--no-verify", action="store_true", help="skip the logit-equivalence proof")
    port.add_argument("--no-rescan", action="store_true", help="skip the re-scan of the output")
    port.add_argument("--force", action="store_true", help="replace the contents of a non-empty --out folder")
    port.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds the proof process may run")
    port.add_argument("--reference-transformers", metavar="VERSION", default=None,
                      help="run the original in this transformers release (default: the transformers_version its config.json declares)")
    port.add_argument("--path", choices=("auto", "backend", "rewrite"), default="auto",
                      help="auto: say so and stop where vLLM serves the model natively, else port for the transformers backend; "
                           "backend: port for the transformers backend even so (retarget to a native transformers class where one "
                           "reproduces the original, else rewrite in place); "
                           "rewrite: always rewrite the remote code in place (keeps its extra methods, e.g. chat helpers)")
    port.set_defaults(handler=run)
    serve = subparsers.add_parser("serve", help="smoke-serve a model folder: real OpenAI-compatible server, one greedy completion, compared with transformers")
    serve.add_argument("dir", help="model folder (config.json, weights, tokenizer)")
    serve.add_argument("--format", choices=("text", "json"), default="text")
    serve.add_argument("--prompt", default=None, help="prompt of the completion (default: 'the')")
    serve.add_argument("--max-tokens", type=int, default=8)
    serve.add_argument("--image", default=None, metavar="FILE",
                       help="a multimodal folder: the image sent beside the prompt (default: a generated 64x64 image)")
    serve.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto",
                       help="auto/vllm: vLLM with --model-impl transformers (the installed vLLM on a GPU, else vLLM's CPU build, set up once); "
                            "transformers: `transformers serve` (not vLLM)")
    serve.add_argument("--tp2", choices=("auto", "yes", "no"), default="auto",
                       help="also serve at tensor-parallel size 2 (auto: when hfcheck predicts it loads and there are 2 cores)")
    serve.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds the server may take to become healthy")
    serve.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        if args.command == "port":
            return _port(args)
        return _serve(args)
    except KeyboardInterrupt:
        return interrupted()


def _porter_defect(exc: BaseException, created: Path | None) -> str:
    """The line for an exception in hfcheck's own port code: what, and the porter function and
    line it came from (the step); a folder this run created is removed, not left half-written."""
    import shutil
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/porter/" in f.filename.replace("\\", "/")]
    where = f" in {frames[-1].name} ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    removed = ""
    if created is not None and created.is_dir():
        shutil.rmtree(created, ignore_errors=True)
        removed = f"; {created} removed"
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"port failed{where}: {type(exc).__name__}: {text}".rstrip(": ") + f" (a defect in hfcheck's porter, not in the model{removed})"


def _port(args) -> int:
    from hfcheck.porter.orchestrate import PortError, port
    from hfcheck.porter.output.render import render_text

    out_existed = args.out is not None and Path(args.out).expanduser().exists()
    try:
        progress = None if args.format == "json" else (lambda line: print(f"port: {line}", file=sys.stderr, flush=True))
        result = port(args.src, args.out, prove=not args.no_verify, rescan=not args.no_rescan, force=args.force, proof_timeout=args.timeout,
                      reference_transformers=args.reference_transformers, path=args.path, log=progress)
    except PortError as exc:
        return fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a defect of the porter's own: one line naming where, never a traceback
        return fail(_porter_defect(exc, None if out_existed or args.out is None else Path(args.out).expanduser()))
    if args.serve and result.status == "ported":
        from hfcheck.runtime.serve import ServeError, smoke_serve

        log = None if args.format == "json" else (lambda line: print(f"serve: {line}", flush=True))
        try:
            result.serve = smoke_serve(args.out, log=log, tp2=TP2[args.tp2]).to_dict()
        except ServeError as exc:
            result.serve = {"ok": False, "error": str(exc)}
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        render_text(result)
        if result.serve is not None:
            from hfcheck.runtime.serve import ServeResult
            from hfcheck.runtime.serve import render_text as render_serve

            if "backend" in result.serve:
                render_serve(ServeResult(**result.serve))
            else:
                print(f"serve: {result.serve['error']}")
    return result.exit_code


def _serve(args) -> int:
    from hfcheck.runtime.serve import DEFAULT_PROMPT, ServeError, render_text, smoke_serve

    log = None if args.format == "json" else (lambda line: print(f"serve: {line}", flush=True))
    try:
        result = smoke_serve(args.dir, prompt=args.prompt or DEFAULT_PROMPT, max_tokens=args.max_tokens, backend=args.backend,
                             startup_timeout=args.timeout, log=log, tp2=TP2[args.tp2], image=args.image)
    except ServeError as exc:
        return fail(str(exc))
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        render_text(result)
    return EXIT_CLEAN if result.ok else EXIT_FINDINGS


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m hfcheck.porter.cli port ...``) until hfcheck/cli.py wires it."""
    parser = Parser(prog="hfcheck")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_parser(sub)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
