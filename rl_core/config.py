"""One typed config for every part of rtrl.

Where values come from, later wins:
  1. the defaults in the models below,
  2. rtrl.toml (RTRL_CONFIG names another file; else ./rtrl.toml, else the repo's),
  3. the profile chosen by RTRL_PROFILE (`default` or `tiny`): rtrl.toml's [profiles.<name>.<section>] tables,
  4. environment variables RTRL_<SECTION>__<KEY> (values parsed as JSON when they parse, else strings),
     and RTRL_HOME for the state folder.

Every relative path is resolved against `home` (default `var/` beside the config file), so one RTRL_HOME
moves the whole embedded stack (lake, MLflow, Airflow, models) somewhere else, which is what tests do.
A bad value raises ConfigError naming the file (or env variable), the section and the key.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from rl_core.config_sources import (
    REPO_ROOT,
    ConfigError,
    deep_merge,
    env_overrides,
    find_config_file,
    flatten,
    format_errors,
)
from rl_core.window import MAX_WINDOW_HOURS

PROFILES = ("default", "tiny")

class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    base: Literal["smollm2-135m", "tiny"] = "smollm2-135m"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # fp32 on CPU: bf16 logprobs disagree by ~0.4
    models_dir: str = "models"
    # tiny random-init model: same architecture family (Llama) and tokenizer as SmolLM2
    tiny_hidden_size: int = Field(64, gt=0)
    tiny_layers: int = Field(2, gt=0)
    tiny_heads: int = Field(4, gt=0)
    tiny_kv_heads: int = Field(2, gt=0)
    tiny_intermediate_size: int = Field(128, gt=0)
    seed: int = 0


class LakeConfig(Section):
    root: str = "lake"  # local folder (relative to home) or any fsspec URL (s3://bucket/rtrl, memory://x)


class MlflowConfig(Section):
    tracking_uri: str = "sqlite:///{home}/mlflow.db"
    artifact_root: str = "mlartifacts"
    experiment: str = "rtrl"
    model_name: str = "rtrl-policy"
    ui_port: int = 5000


class AirflowConfig(Section):
    home: str = "airflow"
    dag_id: str = "realtime_rl"
    schedule_hours: int = Field(5, gt=0)
    training_pool: str = "rtrl_training"
    training_pool_slots: int = Field(1, gt=0)
    retries: int = Field(2, ge=0)
    retry_delay_s: int = Field(60, ge=0)
    ui_port: int = 8080


class ServingConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, gt=0, lt=65536)
    backend: Literal["auto", "vllm", "transformers"] = "auto"  # auto: vLLM where it imports, else transformers
    tokens: dict[str, str] = {"rtrl-dev-token": "org-dev"}  # bearer token -> org_id
    challenger_share: float = Field(0.1, ge=0.0, le=1.0)
    alias_poll_s: float = Field(10.0, gt=0)
    max_body_bytes: int = Field(1_000_000, gt=0)
    max_tokens_default: int = Field(256, gt=0)
    max_tokens_limit: int = Field(2048, gt=0)
    wal_dir: str = "wal"
    segment_max_bytes: int = Field(8 * 1024 * 1024, gt=0)
    segment_max_age_s: float = Field(60.0, gt=0)
    compact_interval_s: float = Field(30.0, gt=0)
    vllm_port_base: int = Field(8100, gt=0, lt=65536)
    vllm_kv_cache_gb: int = Field(2, gt=0)
    vllm_startup_timeout_s: float = Field(180.0, gt=0)
    # swap a retired engine's weights in place (reload_weights + CPU repack: 0.1 s on the tiny model) instead of
    # starting a new engine beside the old one (~45 s on 2 CPUs); off: always a fresh engine (2x memory a while).
    vllm_hot_reload: bool = True
    # reloadable engines kept warm when no alias needs them (after a rollback or promotion), for the next deploy
    spare_engines: int = Field(1, ge=0)
    # start those spares when the gateway starts (champion weights, before it takes traffic), so that the first
    # challenger deploy is a weight swap too; costs one engine start at gateway start and one idle engine's memory
    prewarm_spare: bool = True
    # org adapters on vLLM: engines start with --enable-lora and load each org's live adapter at runtime under its
    # never-reused name (rl_core/orgs/serving.py); off: adapters are merged into transformers copies of their base
    vllm_lora: bool = True
    vllm_max_loras: int = Field(4, gt=0)  # adapters one batch may mix (vLLM --max-loras)
    vllm_max_lora_rank: Literal[8, 16, 32, 64, 128, 256] = 16  # the largest adapter rank served (--max-lora-rank)


class HarvestConfig(Section):
    max_staleness: int = Field(2, ge=0)  # versions behind the policy being updated
    grace_hours: float = Field(6.0, ge=0)  # feedback accepted this long after the window ends
    granularity: Literal["turn", "session"] = "turn"
    session_discount: float = Field(0.9, gt=0, le=1.0)  # credit of a session outcome per turn back
    opt_out_orgs: list[str] = []  # organisations whose traffic is never trained on (data rights)
    # DuckDB's memory for harvest, rewards and the gates; beyond it sorts and joins spill to disk. At 10M
    # interactions the harvest's process peaked at 3.33 GiB from a local lake and 3.23 GiB from S3; at 2.5GB its
    # sort ran out of memory once, before it sorted file numbers instead of file names (docs/benchmarks.md)
    duckdb_memory_limit: str = Field("3GB", pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")
    map_hours: int = Field(0, ge=0)  # harvest in parts of this many hours, a mapped DAG task each (0: one task)
    # the longest window a run may harvest (rl_core/window.py check_window: the CLI's --start/--end, the DAGs'
    # params): a harvest walks every hour partition of its window
    max_window_hours: float = Field(MAX_WINDOW_HOURS, gt=0)

    @model_validator(mode="after")
    def _parts_keep_sessions(self) -> HarvestConfig:  # a session's outcome spans turns an hour's cut would split
        if self.map_hours and self.granularity == "session":
            raise ValueError(f"harvest.map_hours = {self.map_hours} needs harvest.granularity = 'turn'")
        return self


class RewardsConfig(Section):
    weights: dict[str, float] = {
        "edit_persisted": 1.0,
        "edit_reverted": -1.0,
        "dissatisfied_followup": -0.5,
        "latency": -0.1,
        "tool_call_validity": 0.5,
        "clarification": -0.3,
        "thumbs": 0.5,
    }
    latency_budget_ms: float = Field(4000.0, gt=0)
    clarification_rate_max: float = Field(0.34, ge=0, le=1)  # per session, beyond it clarifying is penalised
    reward_clip: float = Field(5.0, gt=0)
    # reward-hacking monitors: a rate rising more than this versus the parent version trips
    monitor_broken_tool_rise: float = Field(0.05, ge=0)
    monitor_clarify_rise: float = Field(0.05, ge=0)
    monitor_empty_rise: float = Field(0.05, ge=0)
    # answers with no tool call and no code block vary more between versions than the rates above
    monitor_no_edit_rise: float = Field(0.10, ge=0)
    monitor_min_episodes: int = Field(20, ge=0)
    # a version whose mean reward falls below its parent's by more than this, and by more than
    # monitor_reward_z standard errors, trips too: the only gate that sees it when the challenger serves everyone
    monitor_reward_drop: float = Field(0.10, ge=0)
    monitor_reward_z: float = Field(2.58, ge=0)

    def config_hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


class TrainConfig(Section):
    launcher: Literal["deepspeed", "torchrun", "inline"] = "deepspeed"
    num_procs: int = Field(1, gt=0)  # processes per node (CPU processes here, GPUs on GPU nodes)
    hostfile: str = ""  # DeepSpeed hostfile for multi-node GPU training
    zero_stage: int = Field(0, ge=0, le=3)  # 0 for one rank; 2/3 shard across GPUs (bench/train_throughput.py)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    lr: float = Field(1e-5, gt=0)
    micro_batch_size: int = Field(4, gt=0)
    grad_accum: int = Field(1, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    epochs: int = Field(1, gt=0)
    max_seq_len: int = Field(1024, gt=0)
    clip_eps: float = Field(0.2, gt=0)
    is_cap: float = Field(2.0, gt=0)
    kl_coef: float = Field(0.02, ge=0)
    entropy_coef: float = Field(0.0, ge=0)
    advantage: Literal["group", "running"] = "group"
    normalize_advantages: bool = True
    lora: bool = False
    lora_r: int = Field(8, gt=0)
    lora_alpha: int = Field(16, gt=0)
    # adapters start at zero and train few weights: the usual LoRA rate is ~10x full fine-tuning's
    lora_lr: float = Field(1e-4, gt=0)
    seed: int = 0
    timeout_s: float = Field(3600.0, gt=0)
    baseline_decay: float = Field(0.9, ge=0, lt=1)  # EMA decay of the running per-org/task reward baseline
    lora_targets: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    checkpoint_every: int = Field(50, ge=0)  # optimizer steps between DeepSpeed checkpoints (resume); 0 = never
    max_steps: int = Field(0, ge=0)  # stop after this many optimizer steps; 0 = the whole epoch(s)


class EvalConfig(Section):
    suite: str = "cursorbench"
    tasks_dir: str = "{repo}/evals/tasks"
    max_turns: int = Field(4, gt=0)
    max_tokens: int = Field(256, gt=0)
    temperature: float = Field(0.0, ge=0)
    workers: int = Field(2, gt=0)
    timeout_s: float = Field(10.0, gt=0)
    task_limit: int = Field(0, ge=0)  # 0 = all tasks
    tolerance: float = Field(0.02, ge=0)  # pass-rate drop tolerated before "regression"
    z: float = Field(1.96, gt=0)  # paired comparison: a drop counts only when significant at this z
    samples: int = Field(1, gt=0)  # episodes per task (k), paired by sample with the baseline's
    seed: int = Field(0, ge=0)  # sampling seeds derive from it (evals.harness.Budget.draw_seed)
    power: float = Field(0.8, gt=0, lt=1)  # the report's minimum detectable change is at this power
    # refuse ("underpowered") when the suite cannot detect a pass-rate drop of this size; 0 = not checked
    max_mde: float = Field(0.0, ge=0, le=1)


class GatesConfig(Section):
    min_episodes: int = Field(64, ge=0)
    min_feedback_share: float = Field(0.2, ge=0, le=1)
    max_org_share: float = Field(0.9, gt=0, le=1)
    reward_min: float = -10.0
    reward_max: float = 10.0
    kl_max: float = Field(0.5, gt=0)


class ABConfig(Section):
    min_samples_per_arm: int = Field(500, gt=0)
    alpha: float = Field(0.05, gt=0, lt=1)
    primary: str = "edit_persisted_rate"
    guardrails: list[str] = ["dissatisfied_rate", "latency_p90_ms"]
    # non-inferiority margins in each metric's units (dissatisfied_rate = 0.05, latency_p90_ms = 250): promote also
    # needs each such guardrail's interval within its margin on the bad side (rl_core/ab/verdict.py); {}: no such check
    guardrail_margins: dict[str, float] = {}
    bootstrap_iters: int = Field(1000, gt=0)
    cuped: bool = False
    cuped_pre_hours: float = Field(168.0, gt=0)  # CUPED covariate: each user's outcomes in this span before `since`

    @field_validator("guardrail_margins")
    @classmethod
    def _known_metrics(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        from rl_core.ab.result import check_margins  # lazy: the A/B's metrics (a module without rtrl imports)

        return check_margins(v, info.data.get("guardrails", []))


class OrgsConfig(Section):
    # the share of an org's users its live adapter answers, by a stable salted hash of the user (docs/orgs.md,
    # "Per-org A/B"); the others get the base version's answer. 1.0: all of them (no control arm)
    ab_share: float = Field(1.0, ge=0.0, le=1.0)


class Preference(Section):
    """What simulated users want of an answer (a feature of rl_core/features.py, present or absent), said
    only through feedback the gateway records (a thumbs per answer; a reverted edit), scored by the reward code."""

    feature: str
    want: bool = True
    # rate only answers that have this feature too (code_block: a complete code block; writes_code: any code):
    # an answer without it gets a thumbs down, so no update is paid for dropping what the preference judges
    needs: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _needs_code(cls, data: object) -> object:
        """`needs_code = true`, the spelling of protocols registered before `needs`, means needs = "code_block"."""
        if isinstance(data, dict) and "needs_code" in data:
            data = dict(data)
            v = data.pop("needs_code")
            if not isinstance(v, bool):
                raise ValueError(f"needs_code must be true or false, got {v!r} (or say needs = \"code_block\")")
            if v:
                data.setdefault("needs", "code_block")
        return data

    @field_validator("feature", "needs")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        from rl_core.features import FEATURES  # lazy: keeps rtrl --help fast (every command loads config)

        if v is not None and v not in FEATURES:
            raise ValueError(f"unknown answer feature {v!r}; known: {', '.join(sorted(FEATURES))}")
        return v


class SimulateConfig(Section):
    users: int = Field(20, gt=0)
    interactions: int = Field(200, gt=0)
    rate: float = Field(5.0, gt=0)  # requests per second, at most
    concurrency: int = Field(4, gt=0)
    seed: int = 0
    orgs: list[str] = ["org-acme", "org-globex"]
    max_seconds: float = Field(1800.0, gt=0)
    max_turns: int = Field(4, gt=0)  # assistant turns per simulated session
    max_tokens: int = Field(96, gt=0)  # per simulated request
    temperature: float = Field(0.8, ge=0)
    # the bank's task ids users may ask (empty: all). bench/task_probe.py lists the tasks a model solves
    # sometimes: only there does its reward vary between answers, so only there can it learn
    tasks: list[str] = []
    # a preference every user holds, and each org's convention (org_id -> preference); bench/feature_census.py
    # measures which features the base model shows often enough for an update to learn from
    preference: Preference | None = None
    conventions: dict[str, Preference] = {}

    @model_validator(mode="after")
    def _conventions_of_known_orgs(self) -> SimulateConfig:
        unknown = sorted(set(self.conventions) - set(self.orgs))
        if unknown:
            raise ValueError(f"conventions for {unknown}, which are not in simulate.orgs {self.orgs}")
        return self


class Config(Section):
    profile: Literal["default", "tiny"] = "default"
    home: str = "var"
    model: ModelConfig = ModelConfig()
    lake: LakeConfig = LakeConfig()
    mlflow: MlflowConfig = MlflowConfig()
    airflow: AirflowConfig = AirflowConfig()
    serving: ServingConfig = ServingConfig()
    harvest: HarvestConfig = HarvestConfig()
    rewards: RewardsConfig = RewardsConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    gates: GatesConfig = GatesConfig()
    ab: ABConfig = ABConfig()
    orgs: OrgsConfig = OrgsConfig()
    simulate: SimulateConfig = SimulateConfig()
    source: str = ""  # the file this came from (informational)

    # --- resolved paths -----------------------------------------------------------------------------
    @property
    def home_path(self) -> Path:
        return Path(self.home)

    def path(self, value: str) -> str:
        """Resolve a configured path: {home}/{repo} placeholders, relative -> under home, URLs untouched."""
        value = value.replace("{home}", str(self.home_path)).replace("{repo}", str(REPO_ROOT))
        if "://" in value or os.path.isabs(value):
            return value
        return str(self.home_path / value)

    @property
    def lake_root(self) -> str:
        return self.path(self.lake.root)

    @property
    def models_dir(self) -> Path:
        return Path(self.path(self.model.models_dir))

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri.replace("{home}", str(self.home_path))

    @property
    def artifact_root(self) -> str:
        return self.path(self.mlflow.artifact_root)

    @property
    def airflow_home(self) -> Path:
        return Path(self.path(self.airflow.home))

    @property
    def wal_dir(self) -> Path:
        return Path(self.path(self.serving.wal_dir))


# --- loading ----------------------------------------------------------------------------------------

def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Config:
    """Load the effective config (file + profile + env). Raises ConfigError naming file and field."""
    environ = dict(os.environ if environ is None else environ)
    file = Path(path) if path else find_config_file()
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    label = str(file) if file else "<defaults>"
    if file:
        try:
            data = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        sources.update({k: str(file) for k in flatten(data)})
    profiles = data.pop("profiles", {}) or {}
    profile = environ.get("RTRL_PROFILE") or data.get("profile") or "default"
    if profile not in PROFILES:
        raise ConfigError(f"RTRL_PROFILE={profile!r}: unknown profile; choose one of {', '.join(PROFILES)}")
    if profile in profiles:
        data = deep_merge(data, profiles[profile], sources, f"{label} [profiles.{profile}]")
    data["profile"] = profile
    data = deep_merge(data, env_overrides(environ, sources), sources, "env")
    base_dir = file.parent if file else REPO_ROOT
    home = environ.get("RTRL_HOME") or data.get("home") or "var"
    data["home"] = str((base_dir / home).resolve()) if not os.path.isabs(home) else home
    data["source"] = label
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, sources, label)) from None
