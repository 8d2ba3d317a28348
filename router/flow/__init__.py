"""One request's path through the cluster, in token ids (docs/design.md, a request's path): the
prefill leg, the decode leg, the KV lease between them, and the flow that composes them."""
