"""The embedded CPU engine (`agl engine`): sglang's HTTP subset over a transformers model.

`server.py` speaks HTTP, `batcher.py` runs the model in one thread with dynamic batching,
`models.py` finds or builds the model folder. Only this package imports torch in the gateway.
"""
