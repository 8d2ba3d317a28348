"""The step: the runner, the persistent batch, a step's results and its timer."""
