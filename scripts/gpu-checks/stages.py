"""The checks of one GPU session, in the order they run, each with its budget in seconds.

The budgets are sized from the first run on an H200 (2026-11-28): a fresh process there spends
tens of seconds importing torch and transformers from a cold disk, the first training step
compiles flex_attention and its block mask for about a minute, and an engine on `base` starts in
about 35 s (its decode graphs at 20 batch sizes). A trainer run of another configuration compiles
again in its own process (inductor's cache on /tmp shortens it).

Ordered by value per second of device time: the install first (everything else runs from it), then
the two headline figures (#47's engine, whose attention backends the 2026-11-30 run left undecided,
then #46's trainer without and with its blocks compiled), whose cost is bounded, then the GPU tests,
of which the 2026-11-30 run got through the engine's first files only, 14 to 26 s for each test that
starts an engine (their log keeps what finished if they are cut), then the figures the issues ask
for beyond the headline ones, those measured on 2026-11-30 last.
A session of 540 s rarely reaches the end; what does not fit is listed as skipped with its budget,
for the next session to pick by name.

Every bench runs through the installed ``relayrl`` with its documented flags; a run whose flags the
command's ``--help`` does not list (a flag another change is still adding) is reported "not available"
instead of failing.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Literal

Kind = Literal["install", "tests", "bench"]


@dataclass(frozen=True, slots=True)
class Run:
    """One command of a bench stage: one line of bench.jsonl."""

    name: str
    args: tuple[str, ...]  # after `relayrl`
    budget_s: int
    env: tuple[tuple[str, str], ...] = ()  # over the session's environment (settings the command has no flag for)

    @property
    def command(self) -> str:
        """The command as a shell would run it."""
        prefix = "".join(f"{key}={shlex.quote(value)} " for key, value in self.env)
        return f"{prefix}relayrl {shlex.join(self.args)}"


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    issues: str
    kind: Kind
    budget_s: int  # a bench stage's is the sum of its runs'
    what: str
    runs: tuple[Run, ...] = field(default=())


def _bench(name: str, issues: str, what: str, *runs: Run) -> Stage:
    return Stage(name, issues, "bench", sum(r.budget_s for r in runs), what, runs)


TRAINER = ("bench", "trainer", "--device", "cuda", "--preset", "base", "--workload", "realistic", "--json")
# A switch's run skips the plain-model baseline (the default run measures it) and takes 3 steps,
# fewer once its run's own limit passes: --timeout-s 40 s inside the budget, since its clock starts
# after the command's imports and the session's SIGINT comes 15 s before the budget's end.
SWITCH = (*TRAINER, "--no-single-process", "--steps", "3")


def _switch(*flags: str, budget_s: int) -> tuple[str, ...]:
    return (*SWITCH, *flags, "--timeout-s", str(budget_s - 40))


ENGINE = ("bench", "engine", "--device", "cuda", "--preset", "base", "--json")
# torch.compile's recompilations and graph breaks, with their reasons, to a run's log.
COMPILE_LOGS = (("TORCH_LOGS", "recompiles,graph_breaks"),)
E2E = ("bench", "e2e", "--workload", "realistic", "--json")
# Prompts and outputs uniform in 4k to 8k tokens, EOS ignored.
LONG = (*ENGINE, "--attention", "triton", "--requests", "16", "--min-len", "4000", "--max-len", "8000")
LONG = (*LONG, "--no-floors", "--timeout-s", "100")
# Where a stage keeps what its later runs read (the learning stage's models): the session's work folder.
WORK = os.environ.get("GPU_CHECKS_WORK", "/tmp/relayrl-gpu-checks")
# The learning stage's models and runs, this call's own.
LEARNING = f"{WORK}/learning-{time.strftime('%Y%m%d-%H%M%S')}"

STAGES: tuple[Stage, ...] = (
    Stage("install", "#50", "install", 150, "scripts/install-offline.sh from the bundle, torch unchanged"),
    # The triton and flex_attention backends side by side, then the floors (HF generate, generate_batch)
    # on the first 32 requests: on all 256 they take minutes. On 2026-11-30 (H200) flex_attention, the
    # auto choice, decoded at 29 ms a step with 256 rows, GPU-bound: it took its general kernel with one
    # 128-row query tile per query head holding one query, and evaluated the mask on every page (its
    # decoding kernel wants a static batch and a power-of-two query group, and base's group is 7). Since
    # then each KV head's group attends as the rows of one query and only a row's last page is masked:
    # this run says what that is worth. Triton's kernel runs first so a cut run still brings its figure.
    # Each engine starts in about 30 s; the floors took 94 s. Each engine then profiles 20 decode steps
    # of 256 rows: where a step's time goes, by kind of kernel.
    _bench(
        "engine",
        "#47",
        "tokens/s of triton and flex_attention against the floors, TTFT, ITL, update pauses",
        Run(
            "base",
            (
                *ENGINE,
                "--attention",
                "triton,flex_attention",
                "--profile-steps",
                "20",
                "--floor-requests",
                "32",
                "--timeout-s",
                "200",
            ),
            260,
        ),
    ),
    # The trainer's MFU (0.15 on 2026-11-30 against a 0.25 target, the plain model no faster), with
    # --profile: one more step under torch.profiler says where the step's time goes; then the same with
    # each decoder block compiled (use_torch_compile), the switch most likely to move it, also profiled.
    # FSDP's ratio to the plain model (0.9545, met) is trainer-switches' to measure again: its baseline
    # costs a second compile.
    _bench(
        "trainer",
        "#46",
        "MFU and where the step's time goes, without and with each decoder block compiled",
        # With COMPILE_LOGS: whether the 73 s warm-up step of 11-30 was one compile or several.
        Run(
            "default",
            (*TRAINER, "--no-single-process", "--profile", "--timeout-s", "110"),
            150,
            COMPILE_LOGS,
        ),
        # Recompilations and graph breaks here too: whether FSDP2's hooks, inside each compiled block's
        # call, break its graph.
        Run("compile", _switch("--use-torch-compile", "--profile", budget_s=170), 170, COMPILE_LOGS),
    ),
    Stage("tests", "#46 #47 #49 #50", "tests", 240, "pytest -m gpu -n 0 (make test-gpu's line)"),
    _bench(
        "e2e-cuda",
        "#50",
        "the four phases on one GPU: gpu_busy_fraction, pipeline_efficiency",
        # Three stacks one after another (alone, async, sync), each starting an engine and a trainer that
        # compile: a call of its own. --budget-s leaves a minute of the budget to stop a stack and print
        # the JSON of the phases that finished.
        Run(
            "realistic-base",
            (
                *("bench", "e2e", "--device", "cuda", "--workload", "realistic", "--preset", "base"),
                *("--budget-s", "420", "--json"),
            ),
            480,
        ),
    ),
    # The plain-model run starts only inside --timeout-s; its compile and warm-up fit in what is left.
    _bench(
        "trainer-switches",
        "#46",
        "FSDP over the plain model; enable_gradient_checkpointing on",
        Run("fsdp-vs-plain", (*TRAINER, "--timeout-s", "140"), 210),
        Run("ckpt", _switch("--enable-gradient-checkpointing", budget_s=150), 150),
    ),
    _bench(
        "rollout-cuda",
        "#47",
        "the rollout service over the CUDA engine against the engine alone",
        Run("default", ("bench", "rollout", "--device", "cuda", "--json"), 90),
    ),
    _bench(
        "openai-cuda",
        "#47",
        "the OpenAI endpoint against the native path on the CUDA engine",
        Run("default", ("bench", "openai", "--device", "cuda", "--json"), 90),
    ),
    # The third attention candidate on the same workload (the base run measured triton, flex_attention
    # and the floors).
    _bench(
        "engine-backends",
        "#47",
        "the torch_native attention backend",
        Run("torch-native", (*ENGINE, "--attention", "torch_native", "--no-floors", "--timeout-s", "130"), 180),
    ),
    # The engine of the base run without its overlap schedule (SGLang's disable_overlap_schedule): what
    # queuing each step's next pass before the read-back is worth on the GPU.
    _bench(
        "engine-no-overlap",
        "#47",
        "the engine without its overlap schedule",
        Run("base", (*ENGINE, "--no-floors", "--no-overlap-schedule", "--timeout-s", "130"), 180),
    ),
    # Few rows of long context, as at the end of a batch of long reasoning traces: the triton backend's
    # decode with each row's keys split (two programs per multiprocessor) and without.
    _bench(
        "engine-long",
        "#47",
        "the triton decode kernel on 16 rows of 8k to 16k tokens, keys split and not",
        Run("split", LONG, 140),
        Run("no-split", LONG, 140, (("RELAYRL_ENGINE_TRITON_ATTENTION_NUM_KV_SPLITS", "1"),)),
    ),
    # flex_attention (auto on cuda) against sdpa over the same packed rows (transformers confines sdpa
    # to each sequence with a dense mask as long as the row squared).
    _bench(
        "trainer-attention",
        "#46",
        "attn_implementation sdpa over the packed rows",
        Run("sdpa", _switch("--attn-implementation", "sdpa", budget_s=150), 150),
    ),
    _bench(
        "trainer-batch",
        "#46",
        "use_remove_padding off; ppo_max_token_len_per_gpu 32768",
        Run("padded", _switch("--no-use-remove-padding", budget_s=150), 150),
        Run("32k", _switch("--micro-batch-tokens", "32768", budget_s=150), 150),
    ),
    # The sampling backends on one step's logits (measured on 2026-11-30; the engine stage samples with auto: triton).
    _bench(
        "sampling",
        "#47",
        "the pytorch and triton samplers at 1, 64 and 256 rows of Qwen's vocabulary",
        Run("base-vocab", ("bench", "sampling", "--device", "cuda", "--json"), 75),
    ),
    # The trainer's log-probs over the vocabulary, eager against compiled (measured on 2026-11-30; the
    # trainer stage runs compiled).
    _bench(
        "logprobs",
        "#46",
        "the log-probs' statistics eager and compiled, a 16k-token pass with Qwen's output head",
        Run("base-head", ("bench", "logprobs", "--device", "cuda", "--json"), 90),
    ),
    # The reasoning recipe on one GPU, as long_add_gpu.yaml's header runs it, against the CPU runs'
    # figures (docs/benchmarks/learning-long-add.json: every seed's held-out score at or above 0.875 by
    # step 100, in 528 to 543 s; #50 asks for the GPU there in a fifth of that). Its folders are the
    # call's own (LEARNING), so a second call on a warm machine finds no earlier run's. Each run's
    # limit leaves the session's SIGINT (15 s before its budget) time to come after the JSON.
    _bench(
        "learning-cuda",
        "#50",
        "the reasoning recipe (long_add, small) on the GPU: steps and seconds to the validation threshold",
        Run("init", ("model", "init-tiny", f"{LEARNING}/small", "--preset", "small"), 45),
        Run(
            "sft",
            (
                *("sft", "--device", "cuda", "--model", f"{LEARNING}/small", "--data", "builtin:long_add"),
                *("--difficulty", "2", "--size", "4800", "--train-batch-size", "32"),
                *("--total-training-steps", "150", "--lr", "1e-3", "--out", f"{LEARNING}/long_add_sft"),
            ),
            150,
        ),
        # The bench's own limit ends the run inside the budget, so it still prints its JSON line.
        Run(
            "learning",
            (
                *("bench", "learning", "--config", "commands/stack/configs/long_add_gpu.yaml"),
                *("--model-dir", f"{LEARNING}/long_add_sft", "--seeds", "1", "--val-threshold", "0.875"),
                *("--out", f"{LEARNING}/learning", "--timeout-s", "290", "--json"),
            ),
            360,
        ),
    ),
    # stack.cpus is auto by default: half the cores to the engine, half to the trainer.
    _bench(
        "e2e-cpu",
        "#50",
        "the CPU pipeline on 16 cores, stack.cpus auto",
        Run("realistic-small", (*E2E, "--preset", "small", "--budget-s", "300"), 360),
    ),
)


def select(words: list[str]) -> list[Stage]:
    """The stages named (``NAME`` or ``NAME=SECONDS``, in the order given), or all of them in order.
    SECONDS replaces the stage's budget; in a stage of several runs, each run's."""
    by_name = {s.name: s for s in STAGES}
    if not words:
        return list(STAGES)
    chosen = []
    for word in words:
        name, _, seconds = word.partition("=")
        if name not in by_name:
            raise SystemExit(f"gpu-checks: unknown stage {name!r}; choose among {', '.join(by_name)}")
        stage = by_name[name]
        if seconds:
            if not seconds.isdigit() or int(seconds) == 0:
                raise SystemExit(f"gpu-checks: {word!r}: the budget must be a whole number of seconds")
            runs = tuple(replace(r, budget_s=int(seconds)) for r in stage.runs)
            total = sum(r.budget_s for r in runs) if runs else int(seconds)
            stage = replace(stage, budget_s=total, runs=runs)
        chosen.append(stage)
    return chosen
