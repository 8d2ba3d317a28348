"""How the pieces reach each other: the API key, Redis, the model, network policy, security."""

from __future__ import annotations

import base64

import pytest
from helm_render import (
    POOLS,
    all_containers,
    arg_after,
    container_port,
    deployments,
    env_of,
    main_container,
    of_kind,
    one,
    pod_spec,
    render,
    selected_components,
)

SPLITSERVE = ("router", "prefill", "decode")
EXTERNAL = "redis://redis.infra.svc:6379/2"


def _api_key_secrets(docs: list) -> list:
    return [s for s in of_kind(docs, "Secret") if s["metadata"]["name"].endswith("-api-key")]


def test_api_key_secret_reaches_the_router_only() -> None:
    docs = render({"auth": {"apiKey": "sk-test"}})
    (secret,) = _api_key_secrets(docs)
    assert base64.b64decode(secret["data"]["api-key"]).decode() == "sk-test"
    router = main_container(deployments(docs)["router"])
    ref = env_of(router)["SPLITSERVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], "api-key")
    assert not any("sk-test" in str(a) for a in router["args"])  # never in the process list
    for component in ("prefill", "decode", "redis"):
        for container in all_containers(deployments(docs)[component]):
            assert "SPLITSERVE_API_KEY" not in env_of(container)


def test_generated_key_when_none_is_given() -> None:
    (secret,) = _api_key_secrets(render())
    assert len(base64.b64decode(secret["data"]["api-key"])) == 40


def test_existing_secret_is_used_as_is() -> None:
    docs = render({"auth": {"existingSecret": "team-llm-key", "secretKey": "token"}})
    assert _api_key_secrets(docs) == []
    ref = env_of(main_container(deployments(docs)["router"]))["SPLITSERVE_API_KEY"]
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "team-llm-key", "key": "token"}


def test_auth_disabled_means_no_key_anywhere() -> None:
    docs = render({"auth": {"enabled": False}})
    assert _api_key_secrets(docs) == []
    router = main_container(deployments(docs)["router"])
    assert "SPLITSERVE_API_KEY" not in env_of(router)


def test_bundled_redis_is_what_every_process_uses() -> None:
    docs = render()
    service = one(docs, "Service", "redis")
    url = f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    redis = main_container(deployments(docs)["redis"])
    assert service["spec"]["ports"][0]["targetPort"] == "redis"
    assert container_port(redis, "redis") == 6379
    for component in SPLITSERVE:
        container = main_container(deployments(docs)[component])
        assert env_of(container)["SPLITSERVE_REDIS_URL"]["value"] == url


def test_bundled_redis_is_absent_with_an_external_url() -> None:
    docs = render({"redis": {"externalUrl": EXTERNAL}})
    assert set(deployments(docs)) == set(SPLITSERVE)
    assert [s for s in of_kind(docs, "Service") if "redis" in s["metadata"]["name"]] == []
    assert [p for p in of_kind(docs, "NetworkPolicy") if "redis" in p["metadata"]["name"]] == []
    for component in SPLITSERVE:
        env = env_of(main_container(deployments(docs)[component]))
        assert env["SPLITSERVE_REDIS_URL"]["value"] == EXTERNAL


def test_external_redis_url_from_a_secret() -> None:
    docs = render({"redis": {"externalUrlSecret": {"name": "redis-cred", "key": "url"}}})
    assert "redis" not in deployments(docs)
    env = env_of(main_container(deployments(docs)["decode"]))["SPLITSERVE_REDIS_URL"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "redis-cred", "key": "url"}


def _policy_for(docs: list, component: str) -> dict:
    policies = [
        p
        for p in of_kind(docs, "NetworkPolicy")
        if selected_components(docs, p["spec"]["podSelector"]) == {component}
    ]
    assert len(policies) == 1, f"{component}: {len(policies)} policies select exactly its pods"
    return policies[0]


def _peers_on_port(docs: list, policy: dict, port: int) -> set[str]:
    """Components allowed to reach `port` by pod selector (same namespace)."""
    allowed: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        covers = any(
            p["port"] == port or p.get("endPort", p["port"]) >= port >= p["port"]
            for p in rule["ports"]
        )
        if covers:
            for peer in rule["from"]:
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    allowed |= selected_components(docs, peer["podSelector"])
    return allowed


@pytest.mark.parametrize("node_http", [False, True])
def test_network_policy_selectors_match_the_pods(node_http: bool) -> None:
    docs = render(
        {"networkPolicy": {"nodeToNodeHttp": node_http}, "transfer": {"extraPorts": [9999]}}
    )
    http_peers = {"router", "prefill", "decode"} if node_http else {"router"}
    for pool in POOLS:
        node = main_container(deployments(docs)[pool])
        policy = _policy_for(docs, pool)
        assert _peers_on_port(docs, policy, container_port(node, "http")) == http_peers
        for port in (container_port(node, "transfer"), 20000, 20999, 9999):
            assert _peers_on_port(docs, policy, port) == {"prefill", "decode"}, port
        assert _peers_on_port(docs, policy, 21000) == set()
    redis = _policy_for(docs, "redis")
    assert _peers_on_port(docs, redis, 6379) == set(SPLITSERVE)
    router = _policy_for(docs, "router")
    (rule,) = router["spec"]["ingress"]
    assert "from" not in rule  # the API is open to clients
    assert [p["port"] for p in rule["ports"]] == [
        container_port(main_container(deployments(docs)["router"]), "http")
    ]


def test_transfer_port_range_matches_ucx() -> None:
    docs = render({"transfer": {"portRange": {"start": 31000, "end": 31063}}})
    for pool in POOLS:
        node = main_container(deployments(docs)[pool])
        assert env_of(node)["UCX_TCP_PORT_RANGE"]["value"] == "31000-31063"
        assert _peers_on_port(docs, _policy_for(docs, pool), 31063) == {"prefill", "decode"}


def test_ports_in_args_match_the_container_ports() -> None:
    docs = render({"prefill": {"httpPort": 9100, "transferPort": 9200}})
    router = main_container(deployments(docs)["router"])
    assert int(arg_after(router, "--port")) == container_port(router, "http") == 8000
    for pool in POOLS:
        node = main_container(deployments(docs)[pool])
        assert int(arg_after(node, "--port")) == container_port(node, "http")
        assert int(arg_after(node, "--transfer-port")) == container_port(node, "transfer")
    assert container_port(main_container(deployments(docs)["prefill"]), "transfer") == 9200


def test_model_pulled_at_start_by_an_init_container() -> None:
    docs = render({"model": {"name": "smollm2", "mountPath": "/cache"}})
    for component in SPLITSERVE:
        spec = pod_spec(deployments(docs)[component])
        (init,) = spec["initContainers"]
        assert init["args"] == ["model", "pull", "smollm2", "--model-cache", "/cache"]
        main = main_container(deployments(docs)[component])
        assert arg_after(main, "--model") == "smollm2"
        assert env_of(main)["SPLITSERVE_MODEL_CACHE"]["value"] == "/cache"
        volume = next(v for v in spec["volumes"] if v["name"] == "model")
        assert "emptyDir" in volume


def test_model_from_a_pvc() -> None:
    docs = render({"model": {"source": "pvc", "pvc": {"claimName": "models"}}})
    for component in SPLITSERVE:
        spec = pod_spec(deployments(docs)[component])
        assert "initContainers" not in spec
        volume = next(v for v in spec["volumes"] if v["name"] == "model")
        assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


def test_containers_run_unprivileged() -> None:
    docs = render()
    for component, deployment in deployments(docs).items():
        assert pod_spec(deployment)["securityContext"]["runAsNonRoot"] is True, component
        for container in all_containers(deployment):
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            writable = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert writable & {"/tmp", "/data"}, f"{component}: no writable scratch volume"
