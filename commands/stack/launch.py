"""What ``relayrl up`` starts, in order, and how the components find each other.

    redis-server (unless RELAYRL_REDIS_URL / stack.redis_url names one)
    queue, paramsync
    engine-0..N-1            built-in engines speaking SGLang's native API (on CPU or on GPUs:
                             stack.device, split as commands/stack/gpus.py says)
    reward                   the reward service, when the config names a reward model (with the engines)
    rollout-0..N-1           one rollout replica per engine
    trainer                  one process, or torchrun with P > 1 (gloo on CPU)

Every port is picked free on loopback; every component gets the shared values (run id, API
token, η, Redis URL) from the same variables, so they cannot disagree.

On a host without a GPU the stack also starts a fork server (``relayrl/forkserver.py``) beside
redis, unless ``RELAYRL_FORKSERVER`` already names one: every Python component, and every restart
of one, is then forked with torch and transformers already imported instead of importing them
again (about 7 s of CPU each).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from commands.stack.config import StackConfig
from commands.stack.cpus import plan_cpus
from commands.stack.gpus import gpu_plan
from commands.stack.process import ComponentError, ComponentSpec, ManagedProcess, http_ready
from commands.stack.supervisor import Supervisor
from relayrl import http_client
from relayrl.forkserver import ENV_VARIABLE as FORKSERVER_VARIABLE
from relayrl.forkserver import ForkServer
from relayrl.forkserver import usable as forkserver_usable
from relayrl.net import free_port, port_open
from relayrl.redis_process import INSTALL_HINT, RedisProcess

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
RELAYRL = [sys.executable, "-m", "commands.cli"]
DEVICE_KEY = "RELAYRL_ENGINE_DEVICE"


@dataclass
class Endpoints:
    """Where each component listens, once the stack is planned."""

    redis_url: str = ""
    queue_grpc: str = ""
    queue_http: str = ""
    paramsync_grpc: str = ""
    paramsync_http: str = ""
    engines: list[str] = field(default_factory=list)
    reward_http: str = ""
    rollouts_http: list[str] = field(default_factory=list)
    trainer_http: str = ""

    def http_services(self) -> dict[str, str]:
        """Every component's HTTP base URL by name (what Prometheus scrapes, what `relayrl ctl` talks to)."""
        urls = {"queue": self.queue_http, "paramsync": self.paramsync_http, "trainer": self.trainer_http}
        if self.reward_http:
            urls["reward"] = self.reward_http
        urls.update({f"engine-{i}": url for i, url in enumerate(self.engines)})
        urls.update({f"rollout-{i}": url for i, url in enumerate(self.rollouts_http)})
        return urls


class LocalStack:
    def __init__(self, config: StackConfig, supervisor: Supervisor) -> None:
        self.config = config
        self.settings = config.stack
        self.supervisor = supervisor
        self.run_id = self.settings.run_id or time.strftime("run-%Y%m%d-%H%M%S")
        self.run_dir = (self.settings.runs_dir / self.run_id).resolve()
        self.api_token = self.settings.api_token or secrets.token_urlsafe(16)
        self.endpoints = Endpoints()
        self.trainer: ManagedProcess | None = None
        self.cpus = plan_cpus(self.settings.cpus, self.settings.rollout_replicas, self.settings.trainer_procs)
        self.gpus = gpu_plan(config)
        self.forkserver: ForkServer | None = None

    # -- plan ---------------------------------------------------------------------------

    def gpu_line(self) -> str | None:
        """The line said at start when components share GPUs (see commands/stack/gpus.py)."""
        return self.gpus.sharing_line(self.settings.trainer_procs) if self.gpus is not None else None

    def route(self, target: str, address: str) -> str:
        """The host:port at which other components reach ``target`` listening on ``address``
        (itself here; `relayrl chaos` puts a fault-injecting proxy in between)."""
        return address

    def _routed_url(self, target: str, url: str) -> str:
        scheme, _, rest = url.partition("://")
        auth, _, hostport_path = rest.rpartition("@")
        hostport, slash, path = hostport_path.partition("/")
        routed = self.route(target, hostport)
        return f"{scheme}://{auth + '@' if auth else ''}{routed}{slash}{path}"

    def _shared_env(self) -> dict[str, str]:
        # max_staleness auto: the trainer alone picks η (it reads RELAYRL_TRAINER_MAX_STALENESS before the
        # shared variable, which other services hold at the limit); a trainer section's own value still wins.
        bound = self.settings.staleness_bound
        auto = {"RELAYRL_TRAINER_MAX_STALENESS": "auto", "RELAYRL_TRAINER_MAX_STALENESS_LIMIT": str(bound)}
        forked = {FORKSERVER_VARIABLE: str(self.forkserver.path)} if self.forkserver is not None else {}
        return {
            **(auto if self.settings.max_staleness == "auto" else {}),
            **forked,
            "RELAYRL_RUN_ID": self.run_id,
            "RELAYRL_API_TOKEN": self.api_token,
            "RELAYRL_MAX_STALENESS": str(bound),
            "RELAYRL_REDIS_URL": self._routed_url("redis", self.endpoints.redis_url),
        }

    def _spec(
        self,
        name: str,
        argv: list[str],
        service: str,
        wiring: dict[str, str],
        ready_url: str | None,
        cpus: tuple[int, ...] | None = None,
        defaults: dict[str, str] | None = None,
    ) -> ComponentSpec:
        # The stack's defaults (the device) under the section's values, its wiring over them: ports
        # and addresses must stay consistent, a device the section names must win.
        env = {**self._shared_env(), **(defaults or {}), **self.config.section_env(service), **wiring}
        if service == "rollout" and self.settings.import_dirs:
            # The modules the config names (tools, interactions, rewards) import from its folder, as in
            # `relayrl check`; only the rollout loads them, so no other service sees that folder first.
            env["PYTHONPATH"] = os.pathsep.join(
                [*self.settings.import_dirs, *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        return ComponentSpec(
            name=name,
            argv=argv,
            env=env,
            ready=http_ready(ready_url) if ready_url else None,
            ready_timeout_s=self.settings.ready_timeout_s,
            log_file=self.run_dir / "logs" / f"{name}.log",
            cpus=cpus,
        )

    def _ports(self, prefix: str) -> tuple[int, int, dict[str, str]]:
        grpc_port, http_port = free_port(HOST), free_port(HOST)
        wiring = {f"{prefix}_HOST": HOST, f"{prefix}_GRPC_PORT": str(grpc_port), f"{prefix}_HTTP_PORT": str(http_port)}
        return grpc_port, http_port, wiring

    # -- start --------------------------------------------------------------------------

    def start(self, model_dir: Path, generation: bool = True, training: bool = True) -> None:
        """Starts every component and returns once each is ready (the trainer once launched).

        ``generation=False`` leaves out the engines and rollouts, ``training=False`` the trainer:
        the bench measures each stage alone with the same services and CPU sets.
        """
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.supervisor.restarts_file = self.restarts_file
        self._start_forkserver()
        self._start_redis()
        if self.forkserver is not None:
            try:
                self.forkserver.wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                log.warning("components start as new interpreters: %s", exc)
                self.forkserver.stop()
                self.forkserver = None
        self._start_queue_and_paramsync()
        # The trainer needs only the queue and paramsync: it loads its model while the engines load
        # theirs (seconds each, on different CPUs) instead of after them.
        if training:
            self.start_training(model_dir)
        if generation:
            # Rollouts watch their engine's health and lease nothing until it is up: all start at once,
            # but engines sharing a GPU one by one (each measures the memory the ones before it hold).
            engines = self._engine_specs(model_dir)
            if self.gpus is not None and self.gpus.serial_start:
                for spec in engines:
                    self.supervisor.start(spec)
                engines = []
            self.supervisor.start_all([*engines, *self._rollout_specs()])
            self._keep_engine_caches()
        self.supervisor.record_restarts()
        self._write_ctl_env()

    @property
    def ctl_env_file(self) -> Path:
        """Endpoints and token for ``relayrl ctl --env-file`` (readable by the owner only: it holds the token)."""
        return self.run_dir / "ctl.env"

    def _write_ctl_env(self) -> None:
        from commands.ctl.config import env_file_text

        e = self.endpoints
        text = env_file_text(
            self.api_token, e.rollouts_http, e.trainer_http, e.queue_grpc, e.paramsync_grpc, str(self.restarts_file),
            e.queue_http,
        )  # fmt: skip
        self.ctl_env_file.touch(mode=0o600)
        self.ctl_env_file.write_text(text)

    def _start_forkserver(self) -> None:
        if self.gpus is not None or FORKSERVER_VARIABLE in os.environ or not forkserver_usable():
            return
        self.forkserver = ForkServer(wait=False)
        self.supervisor.after_stop(self.forkserver.stop)

    def _start_redis(self) -> None:
        if self.settings.redis_url:
            self.endpoints.redis_url = self.settings.redis_url
            return
        redis = RedisProcess(data_dir=self.run_dir / "redis", appendfsync=self.settings.redis_appendfsync)
        try:
            command = redis.command()
        except FileNotFoundError as exc:
            raise ComponentError("redis", str(exc), INSTALL_HINT) from None
        self.endpoints.redis_url = redis.url
        ready = partial(port_open, HOST, redis.port)
        spec = ComponentSpec("redis", command, ready=ready, hint=INSTALL_HINT, cpus=self.cpus.service_cpus)
        self.supervisor.start(spec)

    def _start_queue_and_paramsync(self) -> None:
        q_grpc, q_http, q_wiring = self._ports("RELAYRL_QUEUE")
        p_grpc, p_http, p_wiring = self._ports("RELAYRL_PARAMSYNC")
        self.endpoints.queue_grpc, self.endpoints.queue_http = f"{HOST}:{q_grpc}", f"http://{HOST}:{q_http}"
        self.endpoints.paramsync_grpc = f"{HOST}:{p_grpc}"
        self.endpoints.paramsync_http = f"http://{HOST}:{p_http}"
        self.supervisor.start_all(
            [
                self._spec(
                    "queue",
                    [*RELAYRL, "queue", "serve"],
                    "queue",
                    q_wiring,
                    f"{self.endpoints.queue_http}/readyz",
                    self.cpus.service_cpus,
                ),
                self._spec(
                    "paramsync",
                    [*RELAYRL, "paramsync", "serve"],
                    "paramsync",
                    {**p_wiring, "RELAYRL_PARAMSYNC_SHARED_DIR": str(self.run_dir / "weights")},
                    f"{self.endpoints.paramsync_http}/readyz",
                    self.cpus.service_cpus,
                ),
            ]
        )

    def _engine_specs(self, model_dir: Path) -> list[ComponentSpec]:
        """The engines, and the reward service beside them."""
        specs = self._reward_specs()
        for i in range(self.settings.rollout_replicas):
            port = free_port(HOST)
            url = f"http://{HOST}:{port}"
            self.endpoints.engines.append(url)
            wiring = {
                "RELAYRL_ENGINE_HOST": HOST,
                "RELAYRL_ENGINE_HTTP_PORT": str(port),
                # Replica i samples with engine.seed + i: replicas differ, and the file's seed is honoured.
                "RELAYRL_ENGINE_SEED": str(int(self.config.engine.get("seed", 0)) + i),
                "RELAYRL_ENGINE_TORCH_THREADS": str(self.cpus.engine_threads),
            }
            if "shared_weights_dir" not in self.config.engine and self._engine_device(i).get(DEVICE_KEY) != "cuda":
                # The replicas receive versions there and never change a file the engine serves. Not on
                # CUDA: a version is copied to the device there anyway, and CUDA graphs need the
                # parameters to keep their addresses.
                wiring["RELAYRL_ENGINE_SHARED_WEIGHTS_DIR"] = self._weights_shm_dir()
            argv = [*RELAYRL, "engine", "serve", "--model", str(model_dir), "--port", str(port)]
            specs.append(
                self._spec(
                    f"engine-{i}",
                    argv,
                    "engine",
                    wiring,
                    f"{url}/health",
                    self.cpus.engine_cpus,
                    self._engine_device(i),
                )
            )
        return specs

    def _engine_device(self, index: int) -> dict[str, str]:
        """The engine's device settings under its section's (whose own device wins)."""
        if self.gpus is None:
            return {}
        return {DEVICE_KEY: str(self.config.engine.get("device", "cuda")), **self.gpus.engine_env(index)}

    def _keep_engine_caches(self) -> None:
        """Engines whose memory fraction the stack chose restart with the KV cache they sized at start
        (``max_total_tokens``): by then the trainer and the engines beside them hold their memory, and
        the fraction rule, which counts what others hold, would leave a restarted engine no room."""
        if self.gpus is None:
            return
        for i, fraction in enumerate(self.gpus.engine_mem_fraction):
            if fraction is None:
                continue
            url = f"{self.endpoints.engines[i]}/get_model_info"
            info = http_client.get(url, timeout=30.0).raise_for_status().json()
            tokens = str(info["kv_total_blocks"] * info["kv_block_size"])
            engine = self.supervisor.get(f"engine-{i}")
            engine.spec = replace(engine.spec, env={**engine.spec.env, "RELAYRL_ENGINE_MAX_TOTAL_TOKENS": tokens})

    def _weights_shm_dir(self) -> str:
        """The memory directory the rollout replicas receive versions into (their weights_shm_dir)."""
        from services.rollout.config import RolloutSettings

        default = RolloutSettings.model_fields["weights_shm_dir"].default
        return str(self.config.rollout.get("weights_shm_dir", default))

    def _reward_specs(self) -> list[ComponentSpec]:
        if not self.config.uses_reward_model():
            return []
        port = free_port(HOST)
        self.endpoints.reward_http = f"http://{HOST}:{port}"
        wiring = {"RELAYRL_REWARD_HOST": HOST, "RELAYRL_REWARD_HTTP_PORT": str(port)}
        if "torch_threads" not in self.config.reward:
            # Its forward passes are small; one thread keeps it off the engines' and trainer's cores.
            wiring["RELAYRL_REWARD_TORCH_THREADS"] = "1"
        ready = f"{self.endpoints.reward_http}/readyz"
        return [self._spec("reward", [*RELAYRL, "reward", "serve"], "reward", wiring, ready, self.cpus.service_cpus)]

    def _rollout_specs(self) -> list[ComponentSpec]:
        specs = []
        for i, engine_url in enumerate(self.endpoints.engines):
            _, http_port, wiring = self._ports("RELAYRL_ROLLOUT")
            url = f"http://{HOST}:{http_port}"
            self.endpoints.rollouts_http.append(url)
            wiring |= {
                "RELAYRL_ROLLOUT_REPLICA_ID": f"rollout-{i}",
                "RELAYRL_ROLLOUT_ENGINE_URL": self._routed_url(f"engine-{i}", engine_url),
                "RELAYRL_ROLLOUT_QUEUE_ADDRESS": self.route("queue", self.endpoints.queue_grpc),
                "RELAYRL_ROLLOUT_PARAMSYNC_ADDRESS": self.route("paramsync", self.endpoints.paramsync_grpc),
                "RELAYRL_ROLLOUT_WEIGHTS_DIR": str(self.run_dir / "weights" / f"rollout-{i}"),
            }
            if self.gpus is not None and not self.gpus.engine_beside_first_rank(i):
                # Its engine is on another GPU than the trainer's shared copies: it could only fail to open them.
                wiring["RELAYRL_ROLLOUT_LOAD_WEIGHTS_BY_HANDLE"] = "false"
            if self.endpoints.reward_http:
                wiring |= {
                    "RELAYRL_ROLLOUT_REWARD_MODEL_URL": self._routed_url("reward", self.endpoints.reward_http),
                    "RELAYRL_ROLLOUT_REWARD_KIND": str(self.config.rollout.get("reward_kind", "model")),
                }
            specs.append(
                self._spec(
                    f"rollout-{i}",
                    [*RELAYRL, "rollout", "serve"],
                    "rollout",
                    wiring,
                    f"{url}/healthz",
                    self.cpus.service_cpus,
                )
            )
        return specs

    def start_training(self, model_dir: Path) -> None:
        """Launches the trainer (for a stack started with ``training=False``, later)."""
        self.trainer = self.supervisor.start(self._trainer_spec(model_dir))

    def _trainer_spec(self, model_dir: Path) -> ComponentSpec:
        _, http_port, wiring = self._ports("RELAYRL_TRAINER")
        self.endpoints.trainer_http = f"http://{HOST}:{http_port}"
        wiring |= {
            "RELAYRL_TRAINER_MODEL_DIR": str(model_dir),
            "RELAYRL_TRAINER_RUN_DIR": str(self.run_dir),
            "RELAYRL_TRAINER_QUEUE_ADDRESS": self.route("queue", self.endpoints.queue_grpc),
            "RELAYRL_TRAINER_PARAMSYNC_ADDRESS": self.route("paramsync", self.endpoints.paramsync_grpc),
            # torch's intra-op threads per rank: the trainer's CPU set shared by its ranks.
            "OMP_NUM_THREADS": str(self.cpus.trainer_threads),
        }
        # One process forms its own group of one (services/trainer/distributed.py): a torchrun
        # launcher would add a process, and its imports, that watches a single worker.
        argv = [sys.executable, "-m", "services.trainer"]
        if self.settings.trainer_procs > 1:
            argv[2:2] = ["relayrl.torchrun", "--standalone", "--nproc-per-node", str(self.settings.trainer_procs), "-m"]
        device = {} if self.gpus is None else {"RELAYRL_TRAINER_DEVICE": "cuda", **self.gpus.trainer_env()}
        if self.gpus is not None and any(self.gpus.engine_beside_first_rank(i) for i in range(len(self.gpus.engines))):
            # Engines on rank 0's GPU take each version by CUDA IPC handle (the section may say no).
            device["RELAYRL_TRAINER_SHARE_WEIGHTS_BY_HANDLE"] = "true"
        return self._spec("trainer", argv, "trainer", wiring, None, self.cpus.trainer_cpus, device)

    @property
    def restarts_file(self) -> Path:
        return self.run_dir / "restarts.json"

    def trainer_exit_code(self) -> int | None:
        """The trainer's exit code once its run is over; None while it runs or waits to be
        restarted (the supervisor's ``check_alive`` restarts it or gives up, naming it)."""
        assert self.trainer is not None and self.trainer.process is not None
        code = self.trainer.process.poll()
        if code is None or (code != 0 and self.supervisor.policy.wants_restart(code)):
            return None
        return code


def prepare_model(stack: LocalStack) -> Path:
    """The model to train: the configured directory, or a built-in model of the preset made for this run."""
    if stack.settings.model_dir is not None:
        return stack.settings.model_dir.resolve()
    model_dir = stack.run_dir / "model"
    if not (model_dir / "config.json").exists():
        from relayrl.models.tiny import init_tiny, preset_spec

        spec = preset_spec(stack.settings.model_preset, arch=stack.settings.tiny_arch, seed=stack.settings.tiny_seed)
        init_tiny(model_dir, spec)
    return model_dir
