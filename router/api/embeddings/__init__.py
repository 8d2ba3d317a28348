"""POST /v1/embeddings: pooled hidden states of a decoder model, computed on the prefill pool."""
