"""rtrl's Assets, declared once: each is emitted by the task after which its stage is done (dags/realtime_rl.py),
and `rtrl_episodes` schedules dags/org_adapters.py. One declaration, so the emitter and the scheduled DAG can never
name two different Assets (name and uri are an Asset's identity)."""

from airflow.sdk import Asset

EPISODES = Asset(name="rtrl_episodes", uri="x-rtrl://lake/runs/episodes", group="rtrl")
REWARDS = Asset(name="rtrl_rewards", uri="x-rtrl://lake/runs/rewards", group="rtrl")
CHECKPOINT = Asset(name="rtrl_checkpoint", uri="x-rtrl://models/runs/checkpoint", group="rtrl")
EVAL = Asset(name="rtrl_eval", uri="x-rtrl://lake/runs/eval", group="rtrl")
REGISTRY = Asset(name="rtrl_registry", uri="x-rtrl://mlflow/rtrl-policy", group="rtrl")
