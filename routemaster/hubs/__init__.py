"""The changes streams' per-process hub: open streams fed from the store's commit-safe reads.

Beside the label service: the API opens streams on it and the server hands
their sockets to it; it knows neither Flask nor gunicorn.
"""
