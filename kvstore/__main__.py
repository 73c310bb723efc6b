"""``python -m kvstore``: the ``kvstore`` program (:mod:`server.main`, where ``serve`` can be
imported beside the client commands)."""

from __future__ import annotations

import sys

from server.main import main

sys.exit(main())
