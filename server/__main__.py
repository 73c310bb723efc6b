"""``python -m server``: the same as ``kvstore serve``."""

from __future__ import annotations

import sys

from server.main import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
