"""The lab: everything that exercises the product without being it. The simulator and its protocols
(lab/simulate), seeded test-data generators (lab/testing), the one-machine production stack (lab/stack), the
embedded Airflow (lab/airflow.py) and `rtrl cycle`'s one-machine loop (lab/cycle.py, lab/dagrun.py), the warm
fork server (lab/warm.py) and `rtrl bench` (lab/bench.py). The lab imports the product (rl_core, evals); the
product imports nothing from here (tests/test_imports.py). Its commands join `rtrl` through the `rtrl.commands`
entry point (lab/commands.py)."""
