"""The built-in engine: a Llama-family decoder, HTTP workers, disaggregated prefill/decode
through kvstore and the KV-aware router (see ``engines/README.md``)."""
