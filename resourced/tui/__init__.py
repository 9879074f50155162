"""gpuctl top: a full-screen, live timeline of GPUs against time.

``model`` is the pure part (the visible window, the cursor, the layout: standard library
only, and the layout is ``cli.timeline_view``'s); ``feed`` listens to the daemon's signals
on the bus in a thread (jeepney); ``app`` is the textual application, which needs the
optional extra ``resourced[tui]``.
"""
