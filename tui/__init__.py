"""The Textual dashboard over many models (issue 7): ``hfcheck tui``.

``cli`` is the command (``add_parser`` / ``run``), ``app`` the Textual application, ``scanner``
the background scans (the sweep's worker pool and result cache, cancellable), ``rows`` the
table's data, sorting, filtering and exports, ``detail`` the pane of one model, ``screenshot``
regenerates the README's image (docs/tui.png).

Nothing is imported here: ``hfcheck --help`` does not load Textual.
"""
