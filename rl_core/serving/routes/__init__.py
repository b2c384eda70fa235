"""The gateway's HTTP routes, one APIRouter per concern; rl_core.serving.app.create_app mounts them.

chat    POST /v1/chat/completions, GET /v1/models (the OpenAI surface; logs every completion)
events  POST /v1/feedback, POST /v1/interactions (events from elsewhere)
ops     GET /healthz, GET /metrics (no auth)
deps    what they share, as FastAPI dependencies: the gateway's parts, the token's org, the JSON body
"""
