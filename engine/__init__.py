"""The embedded CPU engine (`agl engine`): sglang's HTTP subset over a transformers model.

`server.py` speaks HTTP, `batcher.py` runs the model in one thread with dynamic batching,
`models.py` finds or builds the model folder. A server of its own: the gateway reaches it over
HTTP, as it reaches sglang, and imports none of it.
"""
