"""One request's path through the cluster, in token ids (DESIGN.md, request flow): the prefill
leg, the decode leg, the KV lease between them, and the flow that composes them."""
