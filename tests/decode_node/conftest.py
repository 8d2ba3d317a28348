"""Fixtures of the node tests (defined in node_harness, shared with tests/prefill_node)."""

from node_harness import model_dir, redis_url

__all__ = ["model_dir", "redis_url"]
