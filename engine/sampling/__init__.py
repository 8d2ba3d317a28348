"""Sampling: the batched sampler, its per-row settings, logit bias and grammar masks."""
