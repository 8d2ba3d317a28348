"""Tensor- and pipeline-parallel engines: one worker process per rank under the engine's process.

The engine's process is rank 0: it owns the scheduler, builds each step's inputs, hands them
to the other ranks (``RankGroup``) and samples from the gathered logits. Ranks 1..N-1 run
``worker.run_rank``: their stage's layers (``pipeline``, ``micro_batch``) and their shard of
those layers' weights and KV cache, one forward per step.
"""

from engine.parallel.group import RankFailed, RankGroup

__all__ = ["RankFailed", "RankGroup"]
