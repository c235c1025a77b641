"""The services under fuzzing, started as real local processes the way ``relayrl up`` starts them.

The trainer gets a queue of its own (another run id on the same Redis), so the groups the
fuzzer pushes, valid or not, are never trained on and the queue's accounting stays the fuzzer's.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from commands.stack.process import ComponentError, ComponentSpec, ManagedProcess, http_ready
from commands.stack.supervisor import Supervisor
from relayrl.net import free_port, port_open
from relayrl.redis_process import INSTALL_HINT, RedisProcess

HOST = "127.0.0.1"
RELAYRL = [sys.executable, "-m", "commands.cli"]
ALL_SERVICES = ("queue", "paramsync", "rollout", "engine", "trainer")


@dataclass
class Target:
    """One running service: where its gRPC and HTTP servers listen, and its process."""

    name: str
    process: ManagedProcess
    http: str = ""
    grpc: str = ""


@dataclass
class Targets:
    api_token: str
    redis_url: str = ""
    by_name: dict[str, Target] = field(default_factory=dict)


def _spec(name: str, argv: list[str], env: dict[str, str], ready_url: str, work: Path) -> ComponentSpec:
    return ComponentSpec(name, argv, env=env, ready=http_ready(ready_url), log_file=work / "logs" / f"{name}.log")


def _ports(prefix: str) -> tuple[str, str, dict[str, str]]:
    g, h = free_port(HOST), free_port(HOST)
    env = {f"{prefix}_HOST": HOST, f"{prefix}_GRPC_PORT": str(g), f"{prefix}_HTTP_PORT": str(h)}
    return f"{HOST}:{g}", f"http://{HOST}:{h}", env


def start_targets(supervisor: Supervisor, work: Path, services: tuple[str, ...]) -> Targets:
    """Starts redis and what ``services`` need (the rollout needs an engine, queue and paramsync)."""
    needed = set(services)
    if "rollout" in needed:
        needed |= {"engine", "queue", "paramsync"}
    if "trainer" in needed:
        needed |= {"paramsync"}
    (work / "logs").mkdir(parents=True, exist_ok=True)
    targets = Targets(api_token=secrets.token_urlsafe(16))
    redis = RedisProcess(data_dir=work / "redis")
    try:
        command = redis.command()
    except FileNotFoundError as exc:
        raise ComponentError("redis", str(exc), INSTALL_HINT) from None
    supervisor.start(ComponentSpec("redis", command, ready=partial(port_open, HOST, redis.port), hint=INSTALL_HINT))
    targets.redis_url = redis.url
    shared = {"RELAYRL_API_TOKEN": targets.api_token, "RELAYRL_REDIS_URL": redis.url, "RELAYRL_RUN_ID": "fuzz"}

    def start(name: str, argv: list[str], env: dict[str, str], http: str, ready: str, grpc: str = "") -> None:
        process = supervisor.start(_spec(name, argv, {**shared, **env}, f"{http}{ready}", work))
        targets.by_name[name] = Target(name, process, http, grpc)

    model_dir = None
    if needed & {"engine", "trainer"}:
        from relayrl.models.tiny import init_tiny

        model_dir = work / "model"
        if not (model_dir / "config.json").exists():
            init_tiny(model_dir)
    for name in ("queue", "paramsync"):
        if name in needed:
            grpc, http, env = _ports(f"RELAYRL_{name.upper()}")
            if name == "paramsync":
                env["RELAYRL_PARAMSYNC_SHARED_DIR"] = str(work / "weights")
            start(name, [*RELAYRL, name, "serve"], env, http, "/readyz", grpc)
    if "engine" in needed:
        port = free_port(HOST)
        http = f"http://{HOST}:{port}"
        env = {"RELAYRL_ENGINE_HOST": HOST, "RELAYRL_ENGINE_HTTP_PORT": str(port)}
        start(
            "engine",
            [*RELAYRL, "engine", "serve", "--model", str(model_dir), "--port", str(port)],
            env,
            http,
            "/health",
        )
    if "rollout" in needed:
        grpc, http, env = _ports("RELAYRL_ROLLOUT")
        env |= {
            "RELAYRL_ROLLOUT_REPLICA_ID": "rollout-0",
            "RELAYRL_ROLLOUT_ENGINE_URL": targets.by_name["engine"].http,
            "RELAYRL_ROLLOUT_QUEUE_ADDRESS": targets.by_name["queue"].grpc,
            "RELAYRL_ROLLOUT_PARAMSYNC_ADDRESS": targets.by_name["paramsync"].grpc,
            "RELAYRL_ROLLOUT_WEIGHTS_DIR": str(work / "weights" / "rollout-0"),
        }
        start("rollout", [*RELAYRL, "rollout", "serve"], env, http, "/healthz", grpc)
    if "trainer" in needed:
        q_grpc, q_http, q_env = _ports("RELAYRL_QUEUE")
        trainer_queue = {**q_env, "RELAYRL_RUN_ID": "fuzz-trainer"}
        start("trainer-queue", [*RELAYRL, "queue", "serve"], trainer_queue, q_http, "/readyz", q_grpc)
        _, http, env = _ports("RELAYRL_TRAINER")
        env |= {
            "RELAYRL_RUN_ID": "fuzz-trainer",
            "RELAYRL_TRAINER_MODEL_DIR": str(model_dir),
            "RELAYRL_TRAINER_RUN_DIR": str(work / "trainer"),
            "RELAYRL_TRAINER_QUEUE_ADDRESS": q_grpc,
            "RELAYRL_TRAINER_PARAMSYNC_ADDRESS": targets.by_name["paramsync"].grpc,
            "OMP_NUM_THREADS": "1",
        }
        argv = [sys.executable, "-m", "relayrl.torchrun", "--standalone", "--nproc-per-node", "1"]
        start("trainer", [*argv, "-m", "services.trainer"], env, http, "/healthz")
    return targets
