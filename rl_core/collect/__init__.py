"""The durable event log: every interaction and feedback event is appended to a write-ahead segment and
fsynced before the gateway answers 2xx (wal.py), then compacted into the lake's Parquet partitions and
deleted (compact.py). EventIndex (index.py) knows which event_ids exist, so feedback for an unknown
interaction is refused. Collector (collector.py) ties the three together for the gateway.
"""
