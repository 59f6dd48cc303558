"""``python -m blocklab.compare``: the same as the ``blocklab-compare`` console script."""

import sys

from blocklab.compare.cli import main

sys.exit(main())
