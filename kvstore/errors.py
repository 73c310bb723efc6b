"""Exceptions the store raises. Each names the problem so that servers can map it to a clear
HTTP 4xx or error frame."""

from __future__ import annotations


class KVStoreError(Exception):
    """Base class of every error kvstore raises on bad input or state."""


class UnknownNamespaceError(KVStoreError, KeyError):
    """A request named a namespace that was never registered."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0]) if self.args else "unknown namespace"


class NamespaceConflictError(KVStoreError):
    """A namespace was registered again with a different layout, size, algorithm or seed."""


class NamespaceLimitError(KVStoreError):
    """A new namespace would pass the cap on namespaces, in total or for its tenant."""


class BlockSizeError(KVStoreError, ValueError):
    """A block's byte size does not match its namespace's ``block_bytes``."""


class InvalidHashError(KVStoreError, ValueError):
    """A block hash is not valid bytes/hex of an accepted length."""


class ChecksumMismatchError(KVStoreError, ValueError):
    """A block's bytes do not match the checksum its writer sent with it: not stored."""


class CapacityError(KVStoreError):
    """No tier can take the block: everything evictable is pinned or the block is larger than
    every tier."""


class InvalidLeaseError(KVStoreError, ValueError):
    """A lease that is not a finite, positive number of seconds."""


class PinQuotaError(KVStoreError):
    """A pin would take its tenant past its quota of pinned bytes. Nothing was pinned; release
    pins (or pin fewer blocks at once) and try again."""


class BusyError(KVStoreError):
    """The server holds as much of this kind of work as it allows (blocks queued for
    prefetch): nothing was queued; try again later."""


class StaleStagingError(KVStoreError):
    """A write named a staged host-slab place that its owner no longer holds (the server
    restarted or dropped the owner's leases). Nothing was written; reserve afresh."""


class WouldBlock(KVStoreError):
    """A call made with ``nowait=True`` would have waited: the store lock was busy, or it
    needed tier I/O (an eviction to disk, a read from disk). Nothing was changed; call again
    without ``nowait``, on a thread that may block."""


class TierUnavailableError(KVStoreError):
    """A tier's back end (LMDB file, S3 endpoint) cannot serve right now."""


class DiskFullError(TierUnavailableError):
    """The disk tier's file system is full (or failing: ENOSPC, EIO): writes to it fail until
    room is made; reads and memory tiers go on."""
