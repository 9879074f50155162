"""The reference documentation and the man pages, generated from the code so they cannot drift.

``facts`` reads what the code says (gpuctl's click commands, the configuration's table
of keys, the exit codes, the D-Bus API's golden copy ``dbus/org.resourced.xml``, the
environment); ``markdown`` writes ``docs/reference/*.md`` from it and ``roff`` the man
pages ``docs/man/man*/*``; ``build`` makes them all in memory, ``names`` says where they
go. ``python -m resourced.docs`` (or ``./dev docs``) writes them into the source tree;
``tests/unit/test_reference_docs.py`` fails when the files in the tree differ from what
the code gives now.

The man pages ship in the wheel (``share/man``: ``man gpuctl`` finds them beside the
``bin`` on ``PATH``) and ``gpuctl service enable --system`` installs them in
``/usr/local/share/man``.
"""
