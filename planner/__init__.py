"""The SLA planner: sizes the prefill and decode pools from TTFT / ITL targets, the load it
sees and predicts, and each pool's capacity learned from the nodes' own metrics.

It reads the router's and the nodes' metrics (directly or from Prometheus), counts every
node in the registry, and publishes its decision (`splitserve_planner_desired_replicas`)
and its inputs as metrics and in Redis. It never starts or stops anything itself: Kubernetes
scales through KEDA / HPA on its metric, `splitserve up --planner` through the launcher.
"""
