"""The HTTP API: FastAPI app factory, schemas, routes."""
