"""The cluster token: one Secret (generated, given, or existing) that the router and every
node read from their environment, never from their command line."""

from __future__ import annotations

import base64

from helm_render import all_containers, deployments, env_of, main_container, of_kind, render

SPLITSERVE = ("router", "prefill", "decode")


def _token_secrets(docs: list) -> list:
    return [s for s in of_kind(docs, "Secret") if s["metadata"]["name"].endswith("-cluster-token")]


def test_the_token_reaches_the_router_and_every_node_by_env() -> None:
    docs = render({"clusterToken": {"token": "a-cluster-token-of-test"}})
    (secret,) = _token_secrets(docs)
    assert base64.b64decode(secret["data"]["cluster-token"]).decode() == "a-cluster-token-of-test"
    for component in SPLITSERVE:
        container = main_container(deployments(docs)[component])
        ref = env_of(container)["SPLITSERVE_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": "cluster-token"}, component
        assert not any("a-cluster-token" in str(a) for a in container.get("args", []))
    for container in all_containers(deployments(docs)["redis"]):
        assert "SPLITSERVE_CLUSTER_TOKEN" not in env_of(container)


def test_a_token_is_generated_when_none_is_given() -> None:
    (secret,) = _token_secrets(render())
    assert len(base64.b64decode(secret["data"]["cluster-token"])) == 48


def test_an_existing_secret_is_used_as_is() -> None:
    docs = render({"clusterToken": {"existingSecret": "team-token", "secretKey": "t"}})
    assert _token_secrets(docs) == []
    for component in SPLITSERVE:
        env = env_of(main_container(deployments(docs)[component]))
        assert env["SPLITSERVE_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "team-token",
            "key": "t",
        }
