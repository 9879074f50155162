"""The ``gpuctl`` command's entry point.

Slurm's hooks go straight to ``slurm_hooks``: slurmd makes every job wait for the prolog,
they take no options, and the command line's machinery (click and the command table)
would add about 40 ms to each job's start. Everything else goes to ``resourced.cli``.
"""

import sys

HOOKS = ("prolog", "epilog")


def entry() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "slurm" and args[1] in HOOKS:
        from resourced.slurm.hooks import run

        sys.exit(run(args[1]))
    from resourced.cli import main

    sys.exit(main())
