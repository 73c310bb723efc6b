"""The router's OpenAI-compatible API: request schemas, OpenAI's error shape, the tokenizer,
choices (token streams turned into text) and the ``/v1`` routes."""
