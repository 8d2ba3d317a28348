"""Where a request goes: the routing policies, the KV-aware cost, the cluster-wide prefix
index and the router's view of the nodes' KV events."""
