"""The server side of the data plane: listeners, connections, op dispatch and direct puts."""
