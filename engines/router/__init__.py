"""The KV-aware router: the routing policy, its view of the workers, its HTTP API and its CLI."""
