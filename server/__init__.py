"""`kvstore serve`: the REST control plane, the data plane and the runtime that starts them."""
