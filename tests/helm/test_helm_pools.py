"""What operators rely on for the pools: replicas, GPUs, autoscaling signals, disruption budgets."""

from __future__ import annotations

import pytest
from helm_render import (
    GPU_VALUES,
    POOLS,
    all_containers,
    arg_after,
    deployments,
    load_values,
    main_container,
    of_kind,
    one,
    pod_spec,
    render,
    selected_components,
)

GPU = "nvidia.com/gpu"
RDMA = "rdma/rdma_shared_device_a"


def _requested(container: dict, resource: str) -> object:
    resources = container.get("resources", {})
    return resources.get("limits", {}).get(resource) or resources.get("requests", {}).get(resource)


def test_replica_counts_come_from_values() -> None:
    docs = render(
        {"router": {"replicas": 3}, "prefill": {"replicas": 2}, "decode": {"replicas": 5}}
    )
    replicas = {c: d["spec"].get("replicas") for c, d in deployments(docs).items()}
    assert replicas == {"router": 3, "prefill": 2, "decode": 5, "redis": 1}


def test_autoscaled_pool_leaves_replicas_to_its_autoscaler() -> None:
    values = {"prefill": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}}}
    docs = render(values)
    assert "replicas" not in deployments(docs)["prefill"]["spec"]
    assert deployments(docs)["decode"]["spec"]["replicas"] == 1
    hpa = one(docs, "HorizontalPodAutoscaler", "prefill")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployments(docs)["prefill"]["metadata"]["name"]
    assert len(of_kind(docs, "HorizontalPodAutoscaler")) == 1


def test_gpus_and_rdma_land_on_prefill_and_decode_only() -> None:
    values = load_values(GPU_VALUES)
    values["redis"] = {"externalUrl": ""}  # bring the bundled Redis back to check it too
    docs = render(values)
    for component, deployment in deployments(docs).items():
        for container in all_containers(deployment):
            is_node = component in POOLS and container["name"] == component
            assert _requested(container, GPU) == (1 if is_node else None), container["name"]
            assert _requested(container, RDMA) == (1 if is_node else None), container["name"]
    for pool in POOLS:
        node = main_container(deployments(docs)[pool])
        assert arg_after(node, "--device") == "cuda"
        assert "--dtype" not in node["args"]  # the node's default on CUDA: bfloat16
        assert "--gpu-memory-utilization" not in node["args"]  # the node's default: 0.9
        assert "IPC_LOCK" in node["securityContext"]["capabilities"]["add"]
        assert pod_spec(deployments(docs)[pool])["runtimeClassName"] == "nvidia"


def test_each_pool_gets_its_own_kv_cache_dtype() -> None:
    docs = render({"prefill": {"kvCacheDtype": ""}, "decode": {"kvCacheDtype": "int8"}})
    prefill = main_container(deployments(docs)["prefill"])
    decode = main_container(deployments(docs)["decode"])
    assert "--kv-cache-dtype" not in prefill["args"]  # the model dtype's KV
    assert arg_after(decode, "--kv-cache-dtype") == "int8"
    with pytest.raises(Exception, match="kvCacheDtype"):
        render({"decode": {"kvCacheDtype": "int4"}})


def test_default_install_needs_no_gpu() -> None:
    docs = render()
    for deployment in deployments(docs).values():
        for container in all_containers(deployment):
            assert _requested(container, GPU) is None
    for pool in POOLS:
        node = main_container(deployments(docs)[pool])
        assert arg_after(node, "--device") == "cpu"
        assert "--gpu-memory-utilization" not in node["args"]


def test_each_pool_requests_a_gpu_per_rank_and_passes_its_tensor_parallel_size() -> None:
    values = {
        "prefill": {"gpus": 1, "tensorParallelSize": 4},
        "decode": {"gpus": 1, "tensorParallelSize": 2},
    }
    docs = render(values)
    for pool, ranks in (("prefill", 4), ("decode", 2)):
        node = main_container(deployments(docs)[pool])
        assert _requested(node, GPU) == ranks
        assert arg_after(node, "--tensor-parallel-size") == str(ranks)


def test_each_pool_requests_tp_times_pp_gpus_and_passes_its_pipeline_parallel_size() -> None:
    values = {
        "prefill": {"gpus": 1, "tensorParallelSize": 2, "pipelineParallelSize": 2},
        "decode": {"gpus": 1, "pipelineParallelSize": 3},
    }
    docs = render(values)
    prefill = main_container(deployments(docs)["prefill"])
    assert _requested(prefill, GPU) == 4
    assert arg_after(prefill, "--pipeline-parallel-size") == "2"
    assert arg_after(prefill, "--tensor-parallel-size") == "2"
    decode = main_container(deployments(docs)["decode"])
    assert _requested(decode, GPU) == 3
    assert arg_after(decode, "--pipeline-parallel-size") == "3"
    assert "--tensor-parallel-size" not in decode["args"]
    with pytest.raises(Exception, match="pipelineParallelSize"):
        render({"prefill": {"pipelineParallelSize": 0}})


def test_cpu_pools_split_over_ranks_request_no_gpu() -> None:
    docs = render({"prefill": {"tensorParallelSize": 2}})
    prefill = main_container(deployments(docs)["prefill"])
    assert arg_after(prefill, "--tensor-parallel-size") == "2"
    assert _requested(prefill, GPU) is None
    decode = main_container(deployments(docs)["decode"])
    assert "--tensor-parallel-size" not in decode["args"]  # 1: the node's default


def test_a_tensor_parallel_size_below_one_is_refused_by_the_schema() -> None:
    with pytest.raises(Exception, match="tensorParallelSize"):
        render({"decode": {"tensorParallelSize": 0}})


def test_each_pool_gets_its_own_gpu_count_and_scheduling() -> None:
    values = {
        "prefill": {"gpus": 2, "nodeSelector": {"pool": "prefill-gpus"}},
        "decode": {
            "gpus": 1,
            "gpuMemoryUtilization": 0.45,
            "tolerations": [{"key": "decode", "operator": "Exists"}],
        },
    }
    docs = render(values)
    prefill, decode = deployments(docs)["prefill"], deployments(docs)["decode"]
    assert _requested(main_container(prefill), GPU) == 2
    assert arg_after(main_container(decode), "--gpu-memory-utilization") == "0.45"
    assert _requested(main_container(decode), GPU) == 1
    assert pod_spec(prefill)["nodeSelector"] == {"pool": "prefill-gpus"}
    assert "nodeSelector" not in pod_spec(decode)
    assert pod_spec(decode)["tolerations"] == [{"key": "decode", "operator": "Exists"}]
    assert "tolerations" not in pod_spec(prefill)


def test_keda_scales_each_pool_on_its_own_signal() -> None:
    docs = render(load_values(GPU_VALUES))
    address = load_values(GPU_VALUES)["keda"]["prometheusServerAddress"]
    prefill = one(docs, "ScaledObject", "prefill")["spec"]
    decode = one(docs, "ScaledObject", "decode")["spec"]
    queries = {
        pool: [t["metadata"]["query"] for t in spec["triggers"]]
        for pool, spec in (("prefill", prefill), ("decode", decode))
    }
    assert queries["prefill"] == [
        'sum(splitserve_waiting_requests{role="prefill",namespace="llm",service="ss-splitserve-prefill"})'
    ]
    assert [q.split("{")[0] for q in queries["decode"]] == [
        "sum(splitserve_running_requests",
        "avg(splitserve_kv_usage_ratio",
    ]
    assert all('role="decode"' in q for q in queries["decode"])
    triggers = prefill["triggers"] + decode["triggers"]
    assert {t["metadata"]["serverAddress"] for t in triggers} == {address}
    assert [t["metadata"]["threshold"] for t in decode["triggers"]] == ["48", "0.8"]
    assert [t["metricType"] for t in decode["triggers"]] == ["AverageValue", "Value"]
    assert (decode["minReplicaCount"], decode["maxReplicaCount"]) == (2, 16)
    assert prefill["scaleTargetRef"]["name"] == "ss-splitserve-prefill"


def test_hpa_scales_each_pool_on_its_own_metric() -> None:
    auto = {"autoscaling": {"enabled": True}}
    docs = render({"prefill": auto, "decode": auto})
    for pool, metric in (
        ("prefill", "splitserve_waiting_requests"),
        ("decode", "splitserve_running_requests"),
    ):
        (spec,) = one(docs, "HorizontalPodAutoscaler", pool)["spec"]["metrics"]
        assert spec["pods"]["metric"]["name"] == metric
        assert spec["pods"]["metric"]["selector"]["matchLabels"] == {"role": pool}


@pytest.mark.parametrize("component", ["router", "prefill", "decode"])
def test_disruption_budget_covers_its_pods(component: str) -> None:
    docs = render({component: {"pdb": {"enabled": True, "maxUnavailable": "25%"}}})
    pdb = one(docs, "PodDisruptionBudget", component)
    assert selected_components(docs, pdb["spec"]["selector"]) == {component}
    assert pdb["spec"]["maxUnavailable"] == "25%"
    docs = render({component: {"pdb": {"minAvailable": 1}}})
    assert one(docs, "PodDisruptionBudget", component)["spec"] == {
        "minAvailable": 1,
        "selector": pdb["spec"]["selector"],
    }


def test_nodes_get_a_memory_backed_dev_shm() -> None:
    docs = render({"decode": {"shmSize": "6Gi"}})
    for pool, size in (("prefill", "2Gi"), ("decode", "6Gi")):
        spec = pod_spec(deployments(docs)[pool])
        mount = next(
            m
            for m in main_container(deployments(docs)[pool])["volumeMounts"]
            if m["mountPath"] == "/dev/shm"
        )
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
