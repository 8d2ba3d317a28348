"""The node core shared by both roles: the HTTP shell and probes (node.server), error
answers (node.errors), metrics (node.metrics), the command line (node.cli) and what a node
builds (node.core: engine loop, transfer agent, registry record)."""
