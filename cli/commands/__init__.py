"""One module per command group; GROUPS is the order `help` lists them in."""

from better_compute.cli.commands import api, catalog, setup

GROUPS = (setup, api, catalog)
