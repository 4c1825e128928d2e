"""``python -m hfcheck.tui [REFS...]``: the dashboard, same options as ``hfcheck tui``."""

from hfcheck.tui.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
