"""One module per command group, each with a ``register(sub)`` that adds its verbs; cli/main.py
lists the groups in the order `help` shows them."""
