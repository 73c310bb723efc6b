"""What the scheduler side tells the worker side each step.

One :class:`KVStoreConnectorMetadata` per engine step crosses from the scheduler process to
every worker (pickled in vLLM's multiprocess mode), so it holds only plain lists, ints and
bytes: which stored blocks to copy into which pages (loads; with the slab extents the
scheduler was granted for them, when the store is on this host) and which freshly computed
pages to store under which hashes (saves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(slots=True)
class BlockTransfer:
    """Blocks of one request: ``hashes[i]`` is stored in (load) or taken from (save) the engine
    page ``block_ids[i]``. Both lists have the same length. ``notify`` marks an asynchronous
    load, whose end the worker reports to vLLM (``get_finished``); a synchronous load feeds
    this step's forward pass and is reported to nobody."""

    req_id: str
    block_ids: list[int]
    hashes: list[bytes]
    notify: bool = True
    # A load's grant (kvstore.client.grant): where each block of namespace ``granted_ns``
    # lies in the slab of server ``instance``, pinned by the scheduler at ``granted_at``
    # (time.monotonic, which is system-wide); None where the worker must fetch the block.
    # Only a worker whose namespace is ``granted_ns`` may use it: with tensor parallelism
    # each rank stores its own shard of a block under its own namespace.
    extents: list[list[list[int]] | None] | None = None
    instance: str = ""
    # each granted block's slab generation, checked after the copy: a moved number means the
    # grant's lease ran out and the slots hold another block now (the block is fetched again)
    gens: list[int | None] | None = None
    # each granted block's recorded checksum: the worker hashes the slab bytes it copied
    # and fetches again (a miss, vLLM recomputes if that fails too) a block that differs
    sums: list[int | None] | None = None
    granted_at: float = 0.0
    granted_ns: str = ""
    # the segment (connectors.vllm.segments) the blocks belong to, and for a segment of
    # several KV cache groups the pages of its other groups: extra_ids[k][i] is block i's
    # page in the segment's group k + 1
    segment: int = 0
    extra_ids: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.block_ids) != len(self.hashes):
            raise ValueError(
                f"request {self.req_id}: {len(self.block_ids)} pages for "
                f"{len(self.hashes)} hashes"
            )
        if any(len(ids) != len(self.hashes) for ids in self.extra_ids):
            raise ValueError(f"request {self.req_id}: a group's pages do not match the hashes")
        if self.extents is not None and len(self.extents) != len(self.hashes):
            raise ValueError(
                f"request {self.req_id}: {len(self.extents)} extents for "
                f"{len(self.hashes)} hashes"
            )


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    """This step's work. An asynchronous load's request waits in vLLM until the worker reports
    it finished (or failed); a synchronous one is copied in ``start_load_kv``, before this
    step's forward pass reads it. Saves name pages that this step's forward pass fills, so the
    worker copies them out in ``wait_for_save``, after the forward."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)

    def of_segment(self, segment: int) -> KVStoreConnectorMetadata:
        """The loads and saves of one segment."""
        return KVStoreConnectorMetadata(
            loads=[t for t in self.loads if t.segment == segment],
            saves=[t for t in self.saves if t.segment == segment],
        )
