"""The OpenAI-compatible gateway: backends (vLLM, transformers) behind one interface, the `auto` router
that follows MLflow aliases, and the FastAPI app that logs every completion durably (rl_core.collect).

For other parts' tests: `rl_core.serving.server.serve_in_thread(cfg, port=0)` is a context manager that
serves the registry's champion/challenger on 127.0.0.1 and yields the base URL (base + "/v1" is the
OpenAI base_url); on exit everything is closed and the WAL compacted into the lake.

Who is asking: the org comes from the bearer token ([serving] tokens). user_id is the OpenAI `user`
field, else the `x-rtrl-user-id` header, else metadata.user_id; session_id the `x-rtrl-session-id`
header or metadata.session_id (else derived from user + first message); turn_index the
`x-rtrl-turn-index` header or metadata.turn_index (else the number of assistant turns so far).
The logged `messages` column is JSON {"messages": [...], "tools": [...] | null}.
"""
