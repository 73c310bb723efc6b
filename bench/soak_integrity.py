"""Integrity soak: an acknowledged block comes back byte-identical or as a miss, never as other
bytes, while everything that has broken that promise elsewhere happens at once.

One ``kvstore serve`` on loopback with an admin token, tenant tokens, tiny leases
(``--lease-s 1``) and a small host tier (blocks go to disk and back). Client processes
(:mod:`soak_actor`): per tenant a writer over TCP, a writer over the Unix socket and a
reader; tenant 0 also has a deleter that drops and registers its namespace again; the admin
a writer and a reader through shared memory, and a late writer that stalls between its
generation check and its copy, past its 0.5 s lease, then copies anyway. Every block's bytes
derive from its namespace and hash, so every get is checked byte for byte. Meanwhile the
soak SIGSTOPs random writers for 1-3 s (past their leases, often mid-put), and ``kill -9``s
the server, flips random bytes in its LMDB file (and damages one value page), then starts
it again.

It counts blocks acknowledged, reads, misses (and the server's corrupt drops by cause),
errors by kind, and **wrong bytes returned, which must be 0** (exit code 1 otherwise).

    python bench/soak_integrity.py --seconds 600 --json out.json   # the full run
    python bench/soak_integrity.py --quick        # 30 s once the clients are up, 2 tenants
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, get_args

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report
from bench.soak_actor import KEYS, block_hash, seed_of
from kvstore.testing.lmdb_pages import damage_value, leaves
from kvstore.testing.server import ServerProc
from kvstore.types import CorruptCause

ACTOR = Path(__file__).with_name("soak_actor.py")
ADMIN = "soak-admin-token"


class Soak:
    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        self.tmp, self.args = tmp, args
        self.rng = random.Random(args.seed)
        self.events: Counter[str] = Counter()
        self.server_counts: Counter[str] = Counter()  # summed over the server's lives
        self._life: dict[str, int] = {}  # the last stats of the running server
        token_file = tmp / "admin.token"
        token_file.write_text(ADMIN)
        self.tenants = {f"t{i}": f"soak-tenant-{i}-token" for i in range(args.tenants)}
        tenants_file = tmp / "tenants.json"
        tenants_file.write_text(json.dumps(self.tenants))
        for f in (token_file, tenants_file):
            f.chmod(0o600)
        self.srv = ServerProc(tmp / "data", "--token-file", str(token_file),
                              "--tenant-tokens-file", str(tenants_file), "--lease-s", "1",
                              "--enable-unix-socket", host_capacity=args.host_capacity,
                              disk_capacity=args.disk_capacity)
        self.actors: list[tuple[dict[str, Any], subprocess.Popen[bytes]]] = []
        self._seeds: dict[str, tuple[str, int]] | None = None

    # -- the clients ---------------------------------------------------------------------------
    def specs(self) -> list[dict[str, Any]]:
        base = {"url": self.srv.url, "block_bytes": self.args.block_bytes,
                "seconds": self.args.seconds + 200}  # stopped by SIGTERM at the end
        out = []
        for i, (tenant, token) in enumerate(self.tenants.items()):
            ns = f"{tenant}-chat"
            for role, transport in (("writer", "tcp"), ("writer", "unix"),
                                    ("reader", "tcp" if i % 2 else "unix")):
                out.append({**base, "token": token, "ns": ns, "role": role,
                            "transport": transport})
            if i == 0:
                out.append({**base, "token": token, "ns": ns, "role": "deleter",
                            "transport": "tcp"})
        for role in ("writer", "reader"):
            out.append({**base, "token": ADMIN, "ns": "admin-shm", "role": role,
                        "transport": "shm"})
        out.append({**base, "token": ADMIN, "ns": "admin-late", "role": "late_shm",
                    "transport": "shm"})
        for n, spec in enumerate(out):
            spec.update(seed=self.args.seed * 1000 + n, out=str(self.tmp / f"actor-{n}.json"))
        return out

    def start_actors(self) -> None:
        for spec in self.specs():
            proc = subprocess.Popen([sys.executable, str(ACTOR), json.dumps(spec)],
                                    stdout=subprocess.DEVNULL,
                                    stderr=open(spec["out"] + ".log", "wb"))  # noqa: SIM115
            self.actors.append((spec, proc))

    def wait_actors(self, timeout_s: float = 180.0) -> None:
        """Until every client has connected once (a loaded machine takes seconds to start
        a dozen interpreters): the chaos clock starts then."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(Path(spec["out"]).exists() or proc.poll() is not None
                   for spec, proc in self.actors):
                return
            time.sleep(0.5)

    def stop_actors(self) -> None:
        for _, proc in self.actors:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for _, proc in self.actors:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- chaos ---------------------------------------------------------------------------------
    def stall_a_writer(self) -> None:
        writers = [p for s, p in self.actors if s["role"] != "reader" and p.poll() is None]
        if not writers:
            return
        proc = self.rng.choice(writers)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(1.0, 3.0))  # past its 1 s leases
        proc.send_signal(signal.SIGCONT)
        self.events["writer_stops"] += 1

    def snapshot(self) -> None:
        try:
            doc = httpx.get(self.srv.url + "/v1/stats", timeout=5,
                            headers={"Authorization": f"Bearer {ADMIN}"}).json()
        except (httpx.HTTPError, ValueError):
            return
        life: Counter[str] = Counter()
        for name, tier in doc.get("tiers", {}).items():
            life[f"corrupt_dropped_{name}"] += tier.get("corrupt_dropped", 0)
            for cause, n in (tier.get("corrupt_by_cause") or {}).items():
                life[f"corrupt_{cause}"] += n
            life[f"evictions_{name}"] += tier.get("evictions", 0)
        life["dropped"] = doc.get("totals", {}).get("dropped", 0)
        self._life = dict(life)

    def crash_and_damage(self) -> None:
        """kill -9, flip bytes in the LMDB file, start again."""
        self.snapshot()
        self.server_counts.update(self._life)
        self._life = {}
        self.srv.kill()
        self.events["server_kills"] += 1
        data = self.tmp / "data" / "lmdb" / "data.mdb"
        if data.exists():
            keys = [k for leaf in leaves(data.read_bytes()) for k, big in leaf.keys
                    if big is not None and not k.startswith(b"\x00")]
            if keys:  # one value page for sure (the disk tier's own damage path)
                damage_value(data, self.rng.choice(keys))
                self.events["value_pages_damaged"] += 1
            raw = bytearray(data.read_bytes())
            psize = 4096
            for _ in range(self.args.flips):  # never the two meta pages: the file must open
                if len(raw) > 64 * psize:  # a file with blocks in it
                    raw[self.rng.randrange(2 * psize, len(raw))] ^= self.rng.randrange(1, 256)
                    self.events["bytes_flipped"] += 1
            data.write_bytes(raw)
        try:
            self.srv.start()
        except RuntimeError:
            # damage the server refuses to open (a flip in a branch page of its own records)
            self.events["restarts_refused"] += 1
            (self.tmp / "data" / "lmdb").rename(self.tmp / f"lmdb-refused-{time.time():.0f}")
            self.srv.start()
        self.events["server_restarts"] += 1

    def run(self) -> dict[str, Any]:
        self.srv.start()
        self.start_actors()
        self.wait_actors()
        until = time.monotonic() + self.args.seconds
        kills = max(1, int(self.args.seconds // 120))
        kill_at = [self.args.seconds * (k + 1) / (kills + 1) for k in range(kills)]
        started = time.monotonic()
        last_stats = 0.0
        while time.monotonic() < until:
            now = time.monotonic() - started
            if kill_at and now >= kill_at[0]:
                kill_at.pop(0)
                self.crash_and_damage()
            elif self.rng.random() < 0.3:
                self.stall_a_writer()
            else:
                time.sleep(0.5)
            if now - last_stats > 2:
                self.snapshot()
                last_stats = now
        self.snapshot()
        self.stop_actors()
        self.server_counts.update(self._life)
        exit_code = self.srv.stop()
        return self.collect(time.monotonic() - started, exit_code)

    def collect(self, elapsed: float, exit_code: int) -> dict[str, Any]:
        counts: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        wrong: list[str] = []
        for spec, _ in self.actors:
            try:
                doc = json.loads(Path(spec["out"]).read_text())
            except (OSError, ValueError):
                errors["actor_report_missing"] += 1
                continue
            counts.update(doc["counts"])
            errors.update(doc["errors"])
            wrong += doc["wrong"]
        return {"seconds": round(elapsed, 1), "actors": len(self.actors),
                "wrong_origins": dict(Counter(self.origin(w) for w in wrong)),
                "counts": dict(counts), "errors": dict(errors), "events": dict(self.events),
                "server": dict(self.server_counts), "wrong_samples": wrong[:20],
                "server_exit": exit_code}


    def origin(self, sample: str) -> str:
        """Whose bytes a wrong read returned: ``namespace`` of the block they belong to
        (``namespace (same hash)``, ``(unknown)``), from the seed they start with."""
        if self._seeds is None:
            names = {spec["ns"] for spec, _ in self.actors}
            self._seeds = {seed_of(ns, block_hash(i)).hex(): (ns, i) for ns in names
                           for i in range(KEYS)}
        wanted, _, got = sample.partition(" got ")
        found = self._seeds.get(got)
        if found is None:
            return "(unknown bytes)"
        ns, i = found
        same = block_hash(i).hex().startswith(wanted.split("/")[1])
        return f"{ns}" + (" (same hash)" if same else "")


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    c, ev, srv = result["counts"], result["events"], result["server"]
    wrong = c.get("wrong", 0)
    rows = [
        ("blocks acknowledged", c.get("acknowledged", 0)),
        ("  of them durable", c.get("acknowledged_durable", 0)),
        ("blocks refused", c.get("refused", 0)),
        ("blocks read", c.get("reads", 0)),
        ("  hits (byte-identical)", c.get("hits", 0)),
        ("  misses", c.get("misses", 0)),
        *[(f"  server: corrupt dropped, {cause}", srv.get(f"corrupt_{cause}", 0))
          for cause in get_args(CorruptCause)],
        ("  server: dropped for good (evicted, lost)", srv.get("dropped", 0)),
        ("namespace deletes", c.get("namespace_deletes", 0)),
        ("writer SIGSTOPs (1-3 s, leases 1 s)", ev.get("writer_stops", 0)),
        ("late shared-memory copies (after a 0.5 s lease)", c.get("late_copies", 0)),
        ("  of them committed", c.get("late_commits_stored", 0)),
        ("server kill -9 and restarts", ev.get("server_kills", 0)),
        ("LMDB bytes flipped", ev.get("bytes_flipped", 0)),
        ("LMDB value pages damaged", ev.get("value_pages_damaged", 0)),
        ("restarts refused (file set aside)", ev.get("restarts_refused", 0)),
        ("client errors (all kinds)", sum(result["errors"].values())),
    ]
    out = [{"case": case, "unit": "count", "value": value, "target": None,
            "meets_target": None} for case, value in rows]
    out.append({"case": "WRONG BYTES RETURNED", "unit": "blocks", "value": wrong, "target": 0,
                "meets_target": wrong == 0})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--quick", action="store_true", help="a run of about 40 s")
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--block-bytes", type=int, default=16 << 10)
    p.add_argument("--host-capacity", default="24MiB", help="small: blocks go to disk and back")
    p.add_argument("--disk-capacity", default="512MiB")
    p.add_argument("--flips", type=int, default=40, help="random LMDB bytes flipped per crash")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--keep", default=None,
                   help="run in this folder and keep it (server and client logs, the file)")
    args = p.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 30.0)
        args.tenants = min(args.tenants, 2)
    with tempfile.TemporaryDirectory(prefix="kvsoak-integrity-") as tmp:
        where = Path(args.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        soak = Soak(where, args)
        try:
            result = soak.run()
        finally:
            soak.stop_actors()
            soak.srv.stop()
    rows = rows_of(result)
    report("soak_integrity", rows, args.json)
    if result["errors"]:
        print("client errors by kind:", json.dumps(result["errors"]))
    for origin, n in result["wrong_origins"].items():
        print(f"  wrong bytes: {n} of the samples hold a block of {origin}")
    if args.json:
        doc = json.loads(Path(args.json).read_text())
        doc["result"] = result
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0 if result["counts"].get("wrong", 0) == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
