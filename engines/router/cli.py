"""``kvstore-router``: the KV-aware router with an OpenAI-compatible API (see
:mod:`engines.router.core` for the policy and :mod:`engines.router.app` for the routes).

``kvstore-router simulate`` runs the same policies on simulated fleets instead
(:mod:`engines.simulator.cli`; ``kvstore-router simulate --help``).

The router may start before its workers: it answers 503 (with what it is waiting for) until
one answers ``/info``, and keeps asking the others. A start that cannot work (a taken
``--port``, no tokenizer at ``--tokenizer``, a bad flag) is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engines.router.api import limits
from engines.router.policies import POLICIES
from kvstore import cli_kit
from kvstore.cli_kit import CommandError

if TYPE_CHECKING:
    from kvstore.cluster.view import ClusterView

PROG = "kvstore-router"


def _urls(text: str) -> list[str]:
    """Comma-separated URLs, each of which may leave out ``http://``."""
    try:
        return [cli_kit.http_url(u) for u in text.split(",") if u.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = cli_kit.Parser(prog=PROG, description="The KV-aware router: an OpenAI-compatible API "
                       "(/v1/completions, /v1/chat/completions, /v1/models) in front of "
                       "kvstore-engine workers. It may start before its workers: it answers "
                       "503 until one answers. 'kvstore-router simulate --help': the same "
                       "policies on simulated fleets of any size.")
    cli_kit.add_version(p)
    p.add_argument("--workers", required=True, type=_urls, metavar="URLS",
                   help="comma-separated worker URLs (roles decode or both); http:// may be "
                        "left out: 127.0.0.1:8480,127.0.0.1:8481")
    p.add_argument("--prefill-workers", default="", type=_urls, metavar="URLS",
                   help="comma-separated prefill worker URLs: enables disaggregated serving "
                        "(default: none)")
    p.add_argument("--kvstore", default=None, type=cli_kit.url_arg, metavar="URL",
                   help="kvstore server URL for prefix lookups (default: none, score by the "
                        "workers' own caches only)")
    p.add_argument("--kvstore-token-file", default=None, metavar="PATH",
                   help="file holding the token of a --kvstore that requires one (its "
                        "--token-file) (default: none)")
    p.add_argument("--cluster", default=None, metavar="REDIS_URL",
                   help="Redis URL of the workers' kvstore cluster (kvstore serve --cluster): "
                        "score each worker by the prefix its own node holds and the one held "
                        "on any node, read from the cluster's index (default: none)")
    p.add_argument("--cluster-heartbeat-s", type=float, default=1.0, metavar="S",
                   help="the nodes' cluster_heartbeat_s, to judge which are up (default: 1.0)")
    p.add_argument("--policy", choices=POLICIES, default="kv",
                   help="kv: soonest first token from cached prefix (local and kvstore) and "
                        "queued work, priced with the workers' measured rates; round-robin, "
                        "least-loaded (fewest queued tokens), session (consistent hashing of "
                        "the request's user field): baselines")
    p.add_argument("--load-weight", type=float, default=None,
                   help="override: scale of a worker's queued work in the kv cost (default: "
                        "1, queued work priced at the worker's measured rates)")
    p.add_argument("--store-weight", type=float, default=None,
                   help="override: fraction of a block's prefill that loading it from kvstore "
                        "saves (default: measured, 1 - prefill rate / load rate)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json; "
                        "usually the model folder), for text prompts, stop strings and chat "
                        "(default: none, token ids only)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model name clients send and /v1/models lists (default: the "
                        "workers' model folder name)")
    p.add_argument("--max-body-bytes", type=int, default=limits.DEFAULT_MAX_BODY_BYTES,
                   metavar="BYTES", help="largest request body; a larger one is refused (413) "
                                         "before it is read")
    p.add_argument("--max-prompt-tokens", type=int, default=None, metavar="TOKENS",
                   help="most tokens in one prompt (400 beyond) (default: the model's context "
                        "length, the workers' max_model_len)")
    p.add_argument("--max-choices", type=int, default=limits.DEFAULT_MAX_CHOICES,
                   metavar="N", help="most prompts x n in one request (400 beyond)")
    p.add_argument("--request-timeout", type=float, default=limits.DEFAULT_REQUEST_TIMEOUT_S,
                   metavar="SECONDS", help="a request still generating this long after it "
                   "arrived ends with an error (504) and its generations are cancelled")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address; beyond loopback --token-file is required")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="file holding the bearer token (an OpenAI client's API key) every "
                        "route but /health then needs; without one the router serves "
                        "loopback only (default: none)")
    p.add_argument("--worker-token-file", default=None, metavar="PATH",
                   help="file holding the workers' token (their --token-file), sent with "
                        "every call to them (default: the --token-file's token)")
    p.add_argument("--port", type=int, default=8490, help="HTTP port")
    p.add_argument("--log-level", default="warning",
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn's log level")
    return p


def serve(args: argparse.Namespace) -> int:
    from engines import listening
    from engines.access import load_token
    from engines.router.api.limits import Limits
    from engines.router.app import create_app
    from engines.router.core import Router
    from engines.store_io import open_store

    if args.tokenizer and not any((Path(args.tokenizer) / name).is_file() for name in
                                  ("tokenizer.json", "tokenizer_config.json")):
        raise CommandError(f"--tokenizer {args.tokenizer}: no tokenizer.json or "
                           "tokenizer_config.json there; give a Hugging Face tokenizer folder "
                           "(or leave --tokenizer out)")
    try:
        caps = Limits(args.max_body_bytes, args.max_prompt_tokens, args.max_choices,
                      args.request_timeout)
    except ValueError as exc:
        raise CommandError(f"limits: {exc}") from None
    token = load_token(args.token_file, args.host)
    worker_token = token
    if args.worker_token_file:
        worker_token = load_token(args.worker_token_file, "127.0.0.1", "--worker-token-file")
    store_token = load_token(args.kvstore_token_file, "127.0.0.1", "--kvstore-token-file")
    cluster = _cluster_view(args.cluster, args.cluster_heartbeat_s) if args.cluster else None
    socks = cli_kit.bind_tcp(args.host, args.port, "--port")
    try:
        router = Router(args.workers, prefill_workers=args.prefill_workers,
                        policy=args.policy, kvstore=open_store(args.kvstore, store_token),
                        load_weight=args.load_weight,
                        store_weight=args.store_weight, worker_token=worker_token,
                        cluster=cluster)
    except ValueError as exc:
        raise CommandError(f"--workers: {exc}") from None
    try:
        app = create_app(router, args.tokenizer, args.served_model_name, caps, token)
    except ValueError as exc:
        raise CommandError(f"--tokenizer {args.tokenizer}: {exc}") from None
    fleet = [listening.count(len(args.workers), "worker")]
    if args.prefill_workers:
        fleet.append(listening.count(len(args.prefill_workers), "prefill worker"))
    details = f"policy {args.policy}, {', '.join(fleet)}, kvstore {args.kvstore or 'none'}"
    listening.serve(app, socks, args.log_level, PROG, details)
    return 0


def _cluster_view(url: str, heartbeat_s: float) -> ClusterView:
    """The cluster's index as the router reads it, with the nodes' timings."""
    from kvstore.cluster.config import ClusterConfig
    from kvstore.cluster.urls import check_url
    from kvstore.cluster.view import ClusterView

    try:
        return ClusterView(ClusterConfig.beating(check_url(url), "router", "", heartbeat_s))
    except ValueError as exc:
        raise CommandError(f"--cluster: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:  # a subcommand beside the router's own flags
        from engines.simulator.cli import main as simulate

        return simulate(argv[1:])
    parser = build_parser()
    if argv and not argv[0].startswith("-"):  # the router itself takes flags only
        parser.error(f"unknown command {argv[0]!r} (the router takes flags; its one command "
                     f"is simulate){cli_kit.did_you_mean(argv[0], ['simulate'], quote=True)}")
    args = parser.parse_args(argv)
    return cli_kit.run(PROG, lambda: serve(args))


if __name__ == "__main__":
    sys.exit(main())
