"""``python -m specdec``: the ``specdec`` console script."""

import sys

from .cli import main

sys.exit(main())
