"""The lab's `rtrl` commands, name -> ("module:function", help), in rl_core/cli.py's form. pyproject.toml
registers this table under the `rtrl.commands` entry point, so `rtrl` lists them while the product names no
lab module; an install without the lab has the product's commands only."""

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("lab.simulate.cli:add_simulate", "simulated users driving the real HTTP API"),
    "experiment": ("lab.simulate.experiment:add_experiment", "run K full cycles and log learning curves"),
    "cycle": ("lab.cycle:add_cycle", "one whole cycle: init, serve, simulate, DAG run, report"),
    "bench": ("lab.bench:add_bench", "run a benchmark from bench/ and print its table"),
    "stack": ("lab.stack.cli:add_stack", "the production stack here: PostgreSQL, Redis, S3, MLflow server, Celery"),
}
