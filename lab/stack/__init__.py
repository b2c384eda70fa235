"""The production stack on one machine (`rtrl stack`, `make stack`): parts.py says what runs, cli.py starts it."""
