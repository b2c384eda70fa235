"""On-policy update of the policy on one cycle's scored episodes (issue 5).

loss.py (the objective), advantages.py (rewards -> advantages), data.py (Parquet -> token batches, through
sql/train/samples.sql, one shard per rank), step.py (one forward + loss, shared by DeepSpeed and the
plain-torch bench), export.py (HF folder out), trainer.py (the DeepSpeed worker process), callbacks.py
(its logging, checkpoints and fault hook), launch.py (the caller side: launcher, summary, verdict, CLI).
"""
