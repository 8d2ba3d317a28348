"""The `splitserve` command and `splitserve up`: the launcher of a local cluster (its plan,
process supervision and socket handover, the embedded Redis and its supervisor, the scaler
that follows the planner). The top floor: it may import every role, explicitly."""
