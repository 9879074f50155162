"""``python -m resourced.daemon``: what the units of every version run."""

import sys

from .main import main

sys.exit(main())
