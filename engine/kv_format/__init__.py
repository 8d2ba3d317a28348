"""The KV cache's element format, below everything that reads or writes a cache tensor (the
kernels, the model's layer ops, the cache's layout): the ``kv_cache_dtype`` names
(``dtypes``, torch-free) and the quantized rows, with the torch reference of the write at
slots (``rows``)."""
