"""The step: the stepper, the runner, the persistent batch, a step's results and its timer,
and the hooks that plug into it (grammar masks here; speculation in engine.speculative)."""
