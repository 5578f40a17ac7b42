"""Cascade's online half and its command line."""
