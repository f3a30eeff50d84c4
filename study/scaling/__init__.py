"""Scalability study: memory and latency against sequence length, one isolated Ray task per cell."""
