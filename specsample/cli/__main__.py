"""``python -m specsample.cli``: the command line, as the ``specsample`` command runs it."""

import sys

from . import main

sys.exit(main())
