"""Faults between hosts: a splitserve cluster whose every process runs on a host of its own
(a network namespace of this machine), faults injected on the wire and into the hosts while
requests stream, and a checker that compares every answer with the fault-free one
(`python -m bench.chaos`, tests/chaos). Modules: netns (hosts), link + impair (faults on
the wire), cluster (the processes), workload + client (the requests), faults, checker,
audit, run, report."""
