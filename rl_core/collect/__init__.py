"""The durable event log: every interaction and feedback event is appended to a write-ahead segment and
fsynced before the gateway answers 2xx (wal.py), then compacted into the lake's Parquet partitions and
deleted (compact.py); a row that cannot be written goes to quarantine/ with its reason (quarantine.py).
EventIndex (index.py) knows which event_ids exist, so feedback for an unknown interaction is refused.
Compaction and `rtrl forget` share one lock on the lake (locks.py). Collector (collector.py) ties them
together for the gateway.
"""
