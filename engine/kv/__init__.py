"""The KV cache: block bookkeeping and the prefix cache, the cache tensor and its sizing."""
