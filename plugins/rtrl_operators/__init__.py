"""rtrl's Airflow operators, usable from any DAG.

`$AIRFLOW_HOME/plugins` (or AIRFLOW__CORE__PLUGINS_FOLDER) is on sys.path, so a DAG imports them as
`from rtrl_operators import DeepSpeedLaunchOperator, DataQualityGateOperator`. They are plain
BaseOperator subclasses: no AirflowPlugin registration is needed for operators in Airflow 3.
"""

from rtrl_operators.deepspeed import DeepSpeedLaunchOperator
from rtrl_operators.quality import DataQualityGateOperator

__all__ = ["DataQualityGateOperator", "DeepSpeedLaunchOperator"]
