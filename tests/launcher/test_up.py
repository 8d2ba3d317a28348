"""`splitserve up` without a model: the command lines it gives its children parse with the
real subcommands, children stop on request (or are killed), die with their parent, and a
child that fails at start is named with its log."""

from __future__ import annotations

import argparse
import http.server
import importlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cluster.auth import ApiKey, find_key
from launcher import cli, up_plan
from launcher import up as launcher
from launcher.process import Child, stop_all
from launcher.up import LaunchError
from launcher.up_announce import announcement
from launcher.up_layout import UpLayout, write_headers
from launcher.up_plan import NodePlan
from tests.models.gguf_files import write_gguf

API_KEY_ENV = "SPLITSERVE_API_KEY"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)",
]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    launcher.add_arguments(parser)
    return parser.parse_args(list(argv))


def _exit_code(argv: list[str]) -> int:
    """What `splitserve up ARGV` exits with (a flag's bad value exits while parsing)."""
    try:
        return cli.main(["up", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


def _keys(args: argparse.Namespace) -> tuple[ApiKey, ...]:
    return up_plan.check_children(args).api_keys()


def _parse_child(argv: list[str]) -> argparse.Namespace:
    """Parse a child's command line with the subcommand module it names."""
    assert argv[:3] == [sys.executable, "-m", "launcher.cli"]
    command, rest = argv[3], argv[4:]
    module = {"router": "router.cli", "prefill": "prefill_node.cli", "decode": "decode_node.cli"}
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(module[command]).add_arguments(parser)
    return parser.parse_args(rest)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_node_command_lines_parse_with_the_node_subcommands(tmp_path: Path) -> None:
    args = _args(
        "--threads-per-node", "2", "--num-kv-blocks", "64", "--transfer", "tcp",
        "--device", "cpu", "--dtype", "bfloat16", "--quantization", "none",
        "--float32-matmul-precision", "medium", "--enforce-eager",
    )  # fmt: skip
    plans = up_plan.plan_nodes(args)
    assert [(p.name, p.role) for p in plans] == [("prefill-0", "prefill"), ("decode-0", "decode")]
    for plan in plans:
        parsed = _parse_child(up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan))
        assert (parsed.port, parsed.node_id, parsed.model) == (plan.port, plan.name, str(tmp_path))
        assert (parsed.torch_threads, parsed.num_kv_blocks, parsed.transfer) == (2, 64, "tcp")
        assert (parsed.device, parsed.dtype, parsed.quantization) == ("cpu", "bfloat16", "none")
        assert parsed.float32_matmul_precision == "medium"
        assert parsed.enforce_eager is True
    router = _parse_child(up_plan.router_argv(args, tmp_path, "redis://h:1/0"))
    assert (router.port, router.redis_url) == (8000, "redis://h:1/0")


def test_nodes_capture_cuda_graphs_unless_told_not_to(tmp_path: Path) -> None:
    for plan in up_plan.plan_nodes(_args()):
        parsed = _parse_child(up_plan.node_argv(_args(), tmp_path, "redis://h:1/0", plan))
        assert parsed.enforce_eager is None  # the node's default: graphs on CUDA


@pytest.mark.parametrize(
    ("flag", "field"), [("--tp", "tensor_parallel_size"), ("--pp", "pipeline_parallel_size")]
)
def test_parallel_sizes_reach_colocated_nodes(tmp_path: Path, flag: str, field: str) -> None:
    args = _args("--colocated", flag, "2")
    launcher.check_args(args)
    for plan in up_plan.plan_nodes(args):
        parsed = _parse_child(up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan))
        assert getattr(parsed, field) == 2


@pytest.mark.parametrize(
    ("flags", "prefill", "decode"),
    [
        (("--prefill-tp", "2"), 2, 0),  # 0: the flag is left out (the node's default, 1)
        (("--decode-tp", "2"), 0, 2),
        (("--tp", "2"), 2, 2),
        (("--tp", "4", "--decode-tp", "1"), 4, 1),
    ],
)
def test_each_pool_gets_its_tensor_parallel_size(
    tmp_path: Path, flags: tuple[str, ...], prefill: int, decode: int
) -> None:
    args = _args(*flags)
    launcher.check_args(args)
    sizes = {
        plan.role: _parse_child(
            up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan)
        ).tensor_parallel_size
        for plan in up_plan.plan_nodes(args)
    }
    assert sizes == {"prefill": prefill or None, "decode": decode or None}


@pytest.mark.parametrize(
    ("flags", "prefill", "decode"),
    [
        (("--prefill-pp", "2", "--decode-pp", "1"), 2, 1),
        (("--decode-pp", "2"), 0, 2),  # 0: the flag is left out (the node's default, 1)
        (("--pp", "3", "--prefill-pp", "1"), 1, 3),
    ],
)
def test_each_pool_gets_its_pipeline_parallel_size(
    tmp_path: Path, flags: tuple[str, ...], prefill: int, decode: int
) -> None:
    args = _args("--tp", "2", *flags)
    launcher.check_args(args)
    parsed = {
        plan.role: _parse_child(up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan))
        for plan in up_plan.plan_nodes(args)
    }
    sizes = {role: p.pipeline_parallel_size for role, p in parsed.items()}
    assert sizes == {"prefill": prefill or None, "decode": decode or None}
    assert {p.tensor_parallel_size for p in parsed.values()} == {2}


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (("--prefill-tp", "0"), "--prefill-tp: must be >= 1, got 0"),
        (("--tp", "0"), "--tp: must be >= 1"),
        (("--decode-pp", "0"), "--decode-pp: must be >= 1, got 0"),
    ],
)
def test_bad_tensor_parallel_flags_are_named(flags: tuple[str, ...], problem: str) -> None:
    with pytest.raises(argparse.ArgumentError, match=problem):
        _args(*flags)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (("--colocated", "--decode-tp", "2"), "use --tensor-parallel-size with --colocated"),
        (("--colocated", "--prefill-pp", "2"), "use --pipeline-parallel-size with --colocated"),
        (("--colocated", "--decode-kv-cache-dtype", "int8"), "use --kv-cache-dtype with"),
    ],
)
def test_a_pool_flag_with_colocated_is_refused(flags: tuple[str, ...], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        launcher.check_args(_args(*flags))


def test_kv_tier_flags_reach_every_node_with_a_disk_directory_each(tmp_path: Path) -> None:
    args = _args(
        "--kv-offload-cpu-gb", "2", "--kv-offload-disk-path", str(tmp_path / "kv"),
        "--kv-offload-disk-gb", "8",
    )  # fmt: skip
    paths = set()
    for plan in up_plan.plan_nodes(args):
        parsed = _parse_child(up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan))
        assert (parsed.kv_offload_cpu_gb, parsed.kv_offload_disk_gb) == (2.0, 8.0)
        assert parsed.kv_offload_disk_path == tmp_path / "kv" / plan.name
        paths.add(parsed.kv_offload_disk_path)
    assert len(paths) == 2  # a node's files are its own
    plain = _parse_child(
        up_plan.node_argv(_args(), tmp_path, "redis://h:1/0", up_plan.plan_nodes(_args())[0])
    )
    assert plain.kv_offload_cpu_gb is None and plain.kv_offload_disk_path is None


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], {"prefill-0": None, "decode-0": None}),
        (["--kv-cache-dtype", "int8"], {"prefill-0": "int8", "decode-0": "int8"}),
        (["--decode-kv-cache-dtype", "int8"], {"prefill-0": None, "decode-0": "int8"}),
        (
            ["--kv-cache-dtype", "fp8_e4m3", "--prefill-kv-cache-dtype", "auto"],
            {"prefill-0": "auto", "decode-0": "fp8_e4m3"},
        ),
    ],
)
def test_kv_cache_dtype_per_pool(tmp_path: Path, argv: list[str], want: dict) -> None:
    """A prefill pool may keep the model dtype's KV while the decode pool keeps int8."""
    args = _args(*argv)
    got = {
        plan.name: _parse_child(
            up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan)
        ).kv_cache_dtype
        for plan in up_plan.plan_nodes(args)
    }
    assert got == want


@pytest.mark.parametrize(
    ("argv", "share"),
    [([], 0.45), (["--gpu-memory-utilization", "0.8", "--decode", "3"], 0.2),
     (["--colocated"], 0.9), (["--prefill", "2", "--decode", "5"], 0.1285)],
)  # fmt: skip
def test_nodes_split_the_gpu_fraction(tmp_path: Path, argv: list[str], share: float) -> None:
    """The nodes of `up` share one GPU: together they take no more than the fraction."""
    args = _args(*argv)
    plans = up_plan.plan_nodes(args)
    shares = [
        _parse_child(
            up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan)
        ).gpu_memory_utilization
        for plan in plans
    ]
    assert shares == [share] * len(plans)
    assert sum(shares) <= (args.gpu_memory_utilization or 0.9)  # 0.9: the default


def test_load_format_reaches_every_node_and_not_the_router(tmp_path: Path) -> None:
    """A node setting no code of the launcher names: its declaration makes it an up flag."""
    args = _args("--load-format", "random")
    for plan in up_plan.plan_nodes(args):
        argv = up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan)
        assert _parse_child(argv).load_format == "random"
    assert "--load-format" not in up_plan.router_argv(args, tmp_path, "redis://h:1/0")


def test_colocated_starts_colocated_nodes_only(tmp_path: Path) -> None:
    args = _args("--colocated", "--decode", "2")
    plans = up_plan.plan_nodes(args)
    assert [(p.name, p.command, p.role) for p in plans] == [
        ("colocated-0", "decode", "colocated"),
        ("colocated-1", "decode", "colocated"),
    ]
    parsed = _parse_child(up_plan.node_argv(args, tmp_path, "redis://h:1/0", plans[0]))
    assert parsed.role == "colocated"


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--decode", "0"], "--decode"), (["--prefill", "0"], "--prefill"),
     (["--model", "./no/such/model"], "no/such/model"),
     (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: must be <= 1, got 1.5"),
     (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens: must be >= 1, got 0"),
     (["--speculative-method", "draft"], "draft_model"),
     (["--kv-offload-disk-gb", "2"], "kv_offload_disk_path and kv_offload_disk_gb go together")],
)  # fmt: skip
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code([*argv, "--port", "0"]) == 2
    assert message in capsys.readouterr().err


def test_a_corrupt_gguf_exits_2_in_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GGUF-only directory whose file was cut short: named with what is wrong, at once."""
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "tokenizer.json").write_text("{}")
    gguf = write_gguf(tmp_path / "m.gguf")
    gguf.write_bytes(gguf.read_bytes()[:-100])
    run_dir = tmp_path / "run"
    assert (
        launcher.run(_args("--model", str(tmp_path), "--port", "0", "--run-dir", str(run_dir))) == 2
    )
    out = capsys.readouterr()
    err = out.err.strip()
    assert "\n" not in err and f"{gguf}: not a valid GGUF file: tensor " in err
    assert "past the end of the file" in err and not run_dir.exists() and "logs:" not in out.out


def test_a_busy_router_port_exits_1_before_the_model_is_pulled(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        args = _args("--port", str(port), "--model", "./no/such/model")
        assert launcher.run(args) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "no/such/model" not in err


def test_port_0_is_accepted_and_a_negative_port_is_named() -> None:
    launcher.check_args(_args("--port", "0"))
    with pytest.raises(ValueError, match="--port must be in"):
        launcher.check_args(_args("--port", "-1"))


def test_planned_node_ports_are_held_until_handed_over() -> None:
    plans = up_plan.plan_nodes(_args("--prefill", "2", "--decode", "1"))
    assert len({p.port for p in plans}) == 3
    for plan in plans:
        assert plan.listener is not None and plan.listener.getsockname()[1] == plan.port
        with pytest.raises(OSError):  # nobody else can take it before the node starts
            socket.create_server(("127.0.0.1", plan.port))
        plan.listener.close()


def test_stop_all_terminates_then_kills(tmp_path: Path) -> None:
    env = dict(os.environ)
    polite = Child("polite", SLEEPER, tmp_path / "polite.log", env)
    stubborn = Child("stubborn", STUBBORN, tmp_path / "stubborn.log", env)
    time.sleep(0.5)  # let the stubborn one install its handler
    started = time.monotonic()
    killed = stop_all([polite, stubborn], grace_s=1.0)
    assert killed == ["stubborn"]
    assert time.monotonic() - started < 5
    assert polite.exit_code() == -signal.SIGTERM
    assert stubborn.exit_code() == -signal.SIGKILL


def test_children_die_with_their_parent(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    parent_code = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from launcher.process import Child
        child = Child("c", {SLEEPER!r}, Path({str(tmp_path / "c.log")!r}), dict(os.environ))
        Path({str(pid_file)!r}).write_text(str(child.pid))
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child_pid = int(pid_file.read_text())
        assert _alive(child_pid)
        parent.kill()  # SIGKILL: no cleanup code runs in the parent
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid)
    finally:
        parent.kill()


def test_a_child_that_fails_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('model dir is broken'); raise SystemExit(3)"]
    child = Child("decode-7", argv, tmp_path / "decode-7.log", dict(os.environ))
    child.proc.wait(timeout=30)
    with pytest.raises(LaunchError) as caught:
        launcher._check_alive([child])
    message = str(caught.value)
    assert "decode-7 exited with code 3" in message and "model dir is broken" in message


def test_node_plan_urls_are_local() -> None:
    assert NodePlan("decode-0", "decode", "decode", 8123).url == "http://127.0.0.1:8123"


def test_sigint_stops_the_launcher_even_when_the_shell_ignored_it() -> None:
    """A script that starts `splitserve up &` hands it SIGINT ignored; Ctrl-C semantics hold."""
    import os
    import signal
    import time

    from launcher.up import _stop_on_sigterm

    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt), _stop_on_sigterm():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored afterwards
    finally:
        signal.signal(signal.SIGINT, saved)


def test_policy_reaches_the_router_command_line(tmp_path: Path) -> None:
    for policy in ("round_robin", "least_loaded", "kv_aware"):
        argv = up_plan.router_argv(_args("--policy", policy), tmp_path, "redis://h:1/0")
        assert _parse_child(argv).policy == policy
    assert _parse_child(up_plan.router_argv(_args(), tmp_path, "redis://h:1/0")).policy is None


def test_up_passes_max_model_len_served_name_and_api_key_through(tmp_path: Path) -> None:
    args = _args(
        "--max-model-len", "96", "--served-model-name", "my-model", "--api-key", "k-123456789",
    )  # fmt: skip
    router_argv = up_plan.router_argv(args, tmp_path, "redis://h:1/0")
    router = _parse_child(router_argv)
    assert (router.max_model_len, router.served_model_name) == (96, "my-model")
    assert router.api_key is None and "k-123456789" not in router_argv  # not on a command line
    assert up_plan.router_environment(args, {"A": "1"}) == {
        "A": "1",
        "SPLITSERVE_API_KEY": "k-123456789",
    }
    for plan in up_plan.plan_nodes(args):
        argv = up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan)
        assert _parse_child(argv).max_model_len == 96 and "k-123456789" not in argv
    plain = _args()
    assert _parse_child(up_plan.router_argv(plain, tmp_path, "redis://h:1/0")).max_model_len is None
    assert up_plan.router_environment(plain, {"A": "1"}) == {"A": "1"}


def test_run_dir_help_names_the_files_written_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args("--run-dir", str(tmp_path))
    nodes = up_plan.plan_nodes(args)
    children = [launcher._spawn(tmp_path, "router", SLEEPER, dict(os.environ))]
    try:
        UpLayout(tmp_path, args, "redis://h:1/0", nodes, children, None, None).write()
    finally:
        stop_all(children, 5.0)
    parser = argparse.ArgumentParser(prog="splitserve up")
    launcher.add_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json", "router.log"]
    assert "cluster.json" in help_text and "NAME.log" in help_text
    assert "pids.json" not in help_text


def test_the_planner_command_line_parses_and_keeps_the_pools_between_up_and_max() -> None:
    args = _args("--planner", "--prefill", "2", "--max-prefill", "5", "--port", "8123")
    argv = up_plan.planner_argv(args, "redis://h:1/0", 9999)
    assert argv[3] == "planner"
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module("planner.cli").add_arguments(parser)
    parsed = parser.parse_args(argv[4:])
    assert parsed.router_url == ["http://127.0.0.1:8123"]
    assert (parsed.min_prefill, parsed.max_prefill, parsed.min_decode) == (2, 5, 1)
    assert parsed.down_cooldown_s == 2 * parsed.up_cooldown_s
    assert parsed.start_timeout_s == args.ready_timeout_s  # a node slow to load still counts
    with pytest.raises(ValueError, match="--max-prefill"):
        launcher.check_args(_args("--planner", "--prefill", "4"))
    with pytest.raises(ValueError, match="--colocated"):
        launcher.check_args(_args("--planner", "--colocated"))


def test_the_router_key_flags_reach_the_router_and_batched_tokens_every_node(
    tmp_path: Path,
) -> None:
    """The README's key flags work on `up` (names and paths on the command line, never a
    key), and vLLM's names for --tp / --pp mean the same."""
    keys = tmp_path / "keys"
    keys.write_text("alice:sk-alice-0123456789\n")
    args = _args(
        "--api-key-file", str(keys), "--usage-admin-keys", "alice",
        "--key-limits", "alice:rpm=60;*:rpm=600", "--max-num-batched-tokens", "256",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "3",
    )  # fmt: skip
    assert [k.name for k in _keys(args)] == ["alice"]
    router_argv = up_plan.router_argv(args, tmp_path, "redis://h:1/0")
    router = _parse_child(router_argv)
    assert (router.api_key_file, router.usage_admin_keys) == (keys, "alice")
    assert router.key_limits == "alice:rpm=60;*:rpm=600"
    assert not any("sk-alice" in a for a in router_argv)
    for plan in up_plan.plan_nodes(args):
        node = _parse_child(up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan))
        assert node.max_num_batched_tokens == 256
        assert (node.tensor_parallel_size, node.pipeline_parallel_size) == (2, 3)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--key-limits", "alice:rpm=x"], "key limit 'alice:rpm=x'"),
        (["--api-key", "bob:sk-bob-0123456789", "--key-limits", "alice:rpm=5"], "alice"),
        (["--usage-admin-keys", "carol"], "no API key is named carol"),
        (["--api-key-file", "/no/such/keys"], "/no/such/keys"),
    ],
)
def test_bad_key_flags_exit_2_before_anything_starts(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launcher.run(_args(*argv, "--port", "0", "--model", "./no/such/model")) == 2
    err = capsys.readouterr().err
    assert problem in err and "no/such/model" not in err and "sk-bob" not in err


class _KeyCheckingRouter(http.server.BaseHTTPRequestHandler):
    """Answers 200 to a POST that carries one of the router's keys, as the router checks it
    (router.endpoints.require_api_key), else 401."""

    keys: tuple[ApiKey, ...] = ()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and find_key(token.strip(), self.keys) is not None
        self.send_response(200 if ok else 401)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("source", ["env", "flag", "file"])
def test_the_printed_request_works_with_several_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """The `try:` line once sent the whole key list (`alice:sk-…,bob:…`) as the bearer token
    and got 401; wherever the keys come from, it works as printed."""
    listed = "alice:sk-alice-0123456789,bob:sk-bob-0123456789"
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.delenv("SPLITSERVE_API_KEY_FILE", raising=False)
    flags: list[str] = []
    if source == "env":
        monkeypatch.setenv(API_KEY_ENV, listed)
    elif source == "flag":
        flags = ["--api-key", listed]
    else:
        (tmp_path / "keys").write_text(listed.replace(",", "\n"))
        flags = ["--api-key-file", str(tmp_path / "keys")]
    server = http.server.HTTPServer(("127.0.0.1", 0), _KeyCheckingRouter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        args = _args(*flags, "--port", str(server.server_address[1]))
        keys = _keys(args)
        _KeyCheckingRouter.keys = keys
        write_headers(tmp_path, "cluster-token-0123456789abcdef", keys[0])
        nodes = [NodePlan("decode-0", "decode", "decode", 8123)]
        text = announcement(args, tmp_path / "smollm2", nodes, tmp_path, keys[0].name)
        command = next(line for line in text.splitlines() if "try:" in line).split("try:")[1]
        done = subprocess.run(
            ["bash", "-c", f"{command} -s -o /dev/null -w '%{{http_code}}'"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.stdout == "200", (command, done.stderr)
    assert "sk-alice" not in text and "sk-bob" not in text  # the key is in the file only
    assert "alice" in text


def test_header_files_are_for_this_user_only(tmp_path: Path) -> None:
    """RUN_DIR's header files serve curl's `-H @FILE`; a run without keys leaves no key file."""
    key = ApiKey("alice", b"sk-alice-0123456789")
    (tmp_path / "cluster-token.header").write_text("old")
    (tmp_path / "cluster-token.header").chmod(0o644)
    write_headers(tmp_path, "cluster-token-0123456789abcdef", key)
    token = tmp_path / "cluster-token.header"
    assert token.read_text() == "x-splitserve-token: cluster-token-0123456789abcdef\n"
    assert (
        tmp_path / "api-key.header"
    ).read_text() == "Authorization: Bearer sk-alice-0123456789\n"
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    write_headers(tmp_path, "cluster-token-0123456789abcdef", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster-token.header"]
    args = _args("--port", "8000")
    nodes = [NodePlan("prefill-0", "prefill", "prefill", 8123)]
    text = announcement(args, tmp_path / "smollm2", nodes, tmp_path, None)
    assert f"stats: curl -H @{token} http://127.0.0.1:8123/stats" in text
    assert "api-key.header" not in text and "Authorization" not in text
