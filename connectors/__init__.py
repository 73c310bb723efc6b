"""Engine connectors: how serving engines load and save their KV through kvstore."""
