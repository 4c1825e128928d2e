"""The Textual dashboard over many models (issue 7): ``hfcheck tui``.

``cli`` is the command (``add_parser`` / ``run``), ``app`` the Textual application, which
composes the widgets, each the owner of its state and speaking through Textual messages:
``filter_bar`` (the text and verdict filters), ``results_table`` (the rows, their sort, the
highlighted one), ``detail_pane`` (the model shown), ``sort_label`` and ``scan_progress`` (the
bar and status line). ``scanner`` runs the background scans (the sweep's worker pool and result
cache, cancellable), ``rows`` holds the table's data, sorting, filtering and exports, ``detail``
renders the pane of one model, ``screenshot`` regenerates the README's image (docs/tui.png).

Nothing is imported here: ``hfcheck --help`` does not load Textual.
"""
