"""``python -m kvstore``: the ``kvstore`` command line."""

from __future__ import annotations

import sys

from kvstore.cli import main

sys.exit(main())
