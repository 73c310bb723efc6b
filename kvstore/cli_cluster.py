"""``kvstore cluster status``: a running node's cluster as a table (``--url``,
``KVSTORE_URL``; the admin's token): each node's state, address, blocks, tiers and how long
since it was heard from, and this node's link to Redis. Exit code 0 when Redis answers the
node, 1 when the node is degraded."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvstore.cli_client import _client_args, _read, _request, size, table
from kvstore.protocol.cluster import ClusterStatus


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cluster", help="a running node's cluster: its nodes and Redis")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    status = verbs.add_parser("status", help="every node's state (up, suspect, gone), "
                              "address, blocks and tiers; this node's link to Redis (exit "
                              "code 0 connected, 1 degraded)")
    _client_args(status)
    p.set_defaults(handler=run)


def format_status(status: ClusterStatus) -> str:
    redis = status.redis
    link = "connected" if redis.connected else f"DEGRADED ({redis.error or 'no answer'})"
    lines = [f"node {status.node_id} (slot {status.slot or '-'}) via {redis.url}"
             f"{' (Redis Cluster)' if redis.cluster_mode else ''}: {link}",
             f"index: {status.index.published} published, {status.index.pending} pending, "
             f"{status.index.resyncs} resyncs, {status.index.dropped} dropped; read from "
             f"peers: {status.fetched.blocks} blocks ({size(status.fetched.bytes)})",
             f"timings: heartbeat {status.heartbeat_s:g}s, suspect after "
             f"{status.suspect_after_s:g}s, gone after {status.gone_after_s:g}s"]
    rows = [("node", "state", "address", "blocks", "tiers", "silent")]
    for n in status.nodes:
        tiers = " ".join(f"{t.name} {size(t.used_bytes)}/{size(t.capacity_bytes)}"
                         for t in n.tiers) or "-"
        rows.append((n.node_id + (" *" if n.node_id == status.node_id else ""),
                      n.state.value, n.address, str(n.blocks), tiers, f"{n.silent_s:.1f}s"))
    lines += ["", table(rows)]
    if not status.nodes:
        lines.append("(no nodes listed: Redis does not answer this node)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    doc = _request(args, "GET", "/v1/cluster")
    status = _read(args, "/v1/cluster", doc, "a cluster status", ClusterStatus.model_validate)
    print(json.dumps(doc, indent=2) if args.json else format_status(status))
    return 0 if status.redis.connected else 1
