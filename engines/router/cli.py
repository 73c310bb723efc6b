"""``kvstore-router``: the KV-aware router with an OpenAI-compatible API (see
:mod:`engines.router.core` for the policy and :mod:`engines.router.app` for the routes)."""

from __future__ import annotations

import argparse
import sys


def _urls(text: str) -> list[str]:
    urls = [u.strip() for u in text.split(",") if u.strip()]
    return [u if "://" in u else f"http://{u}" for u in urls]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvstore-router", description=__doc__)
    p.add_argument("--workers", required=True, help="comma-separated worker URLs (decode/both)")
    p.add_argument("--prefill-workers", default="",
                   help="comma-separated prefill worker URLs: enables disaggregated serving")
    p.add_argument("--kvstore", default=None, help="kvstore server URL for prefix lookups")
    p.add_argument("--policy", choices=("kv", "round-robin"), default="kv")
    p.add_argument("--load-weight", type=float, default=1.0,
                   help="weight of a worker's queued work (tokens) against a request's own")
    p.add_argument("--store-weight", type=float, default=0.5,
                   help="fraction of a block's compute that loading it from kvstore saves")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder for text prompts")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8490)
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)

    import uvicorn

    from engines.router.app import create_app
    from engines.router.core import Router

    try:
        router = Router(_urls(args.workers), prefill_workers=_urls(args.prefill_workers),
                        policy=args.policy, kvstore=args.kvstore, load_weight=args.load_weight,
                        store_weight=args.store_weight)
    except ValueError as exc:
        print(f"kvstore-router: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(router, args.tokenizer), host=args.host, port=args.port,
                log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
