"""The REST control plane: the FastAPI app, its routes, request/response schemas and limits."""
