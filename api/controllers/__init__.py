"""Controllers: code that reacts to events and to time, once per deployment.

``NodeLifecycle`` (node_lifecycle.py) starts acceptance and marks silent
nodes unreachable; ``Leadership`` (leader.py) makes sure exactly one
``serve`` process of a deployment runs controllers; ``run_controllers``
(runner.py) ties both to the server's lifespan.
"""
