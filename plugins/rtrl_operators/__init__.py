"""rtrl's Airflow operators, usable from any DAG.

`$AIRFLOW_HOME/plugins` (or AIRFLOW__CORE__PLUGINS_FOLDER) is on sys.path, so a DAG imports them as
`from rtrl_operators import DeepSpeedLaunchOperator, DataQualityGateOperator`. They are plain
BaseOperator subclasses: no AirflowPlugin registration is needed for operators in Airflow 3.

File names matter: Airflow's plugin loader imports every .py under the plugins folder as a top-level
module named after the file, so a `deepspeed.py` here would shadow the real `deepspeed` package in every
task process (tests/test_dag_plugins.py guards this).
"""

from rtrl_operators.deepspeed_launch import DeepSpeedLaunchOperator
from rtrl_operators.quality_gate import DataQualityGateOperator

__all__ = ["DataQualityGateOperator", "DeepSpeedLaunchOperator"]
