"""Cascade's online half: the API, the request path, its stages, stores, inference, embedding
cache, drift counting and the state follower."""
