"""The KV cache: block bookkeeping and the prefix cache, the cache tensor (quantized rows
included) and its sizing, KV events, and the host-memory and disk tiers below it."""
