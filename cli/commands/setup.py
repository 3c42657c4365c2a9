"""init and serve: set up a store, run the API."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.files import check_new_file, write_new_secret
from better_compute.cli.registry import add_verb


def init(ctx: Context, args: argparse.Namespace) -> int:
    from better_compute.api import pki
    from better_compute.api.runtime import Runtime

    if args.out:
        check_new_file(args.out)
    runtime = Runtime.open(ctx.env)
    try:
        service = runtime.service
        if service.is_initialized():
            service.initialize({}, "")  # raises the "already initialized" conflict
        # The key and the serving CA live in the data dir even when the store is PostgreSQL.
        runtime.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_path = runtime.master_key_path()
        if runtime.env.get("BETTER_COMPUTE_MASTER_KEY"):
            key_text, key_note = runtime.env["BETTER_COMPUTE_MASTER_KEY"], "from BETTER_COMPUTE_MASTER_KEY"
        elif key_path.exists():
            key_text, key_note = key_path.read_text(), f"{key_path} (existing)"
        else:
            key_text = pki.new_master_key()
            write_new_secret(key_path, key_text, "master key file")
            key_note = str(key_path)
        bundle = pki.generate_bundle()
        sealed = pki.seal_bundle(bundle, pki.parse_master_key(key_text))
        public = pki.public_parts(bundle)
        secret = service.initialize(public, sealed)
        ca_path = runtime.data_dir / "serving-ca.pem"
        ca_path.write_text(public["servingCaCertificate"])
        print(f"initialized {runtime.config.describe()}")
        print(f"master key: {key_note} — it opens the sealed PKI bundle; keep it apart from backups of the store")
        print(f"serving CA certificate: {ca_path}")
        print(f"  export BETTER_COMPUTE_CA_FILE={ca_path}")
        if args.out:
            out = write_new_secret(args.out, secret)
            print(f"root administrator token written to {out} (mode 0600); it is shown nowhere else")
        else:
            print("root administrator token (shown once, store it now):")
            print(secret)
        return 0
    finally:
        runtime.close()


def serve(ctx: Context, args: argparse.Namespace) -> int:
    from better_compute.api.http.serve import ServeOptions
    from better_compute.api.http.serve import serve as run_server
    from better_compute.api.http.server_config import resolve
    from better_compute.api.http.workers import default_workers

    config = resolve(vars(args), ctx.env, args.config)
    v = config.values
    run_server(
        ServeOptions(listen=v["listen"], hostnames=list(v["hostnames"] or []),
                     insecure_loopback=bool(v["insecure_loopback"]),
                     gateway_url=v["gateway.url"], log_level=v["log.level"],
                     gateway_listen=v["gateway.listen"], log_format=v["log.format"],
                     metrics_listen=v["metrics.listen"],
                     workers=default_workers() if v["workers"] is None
                     else int(v["workers"]),
                     workers_from_default=v["workers"] is None),
        config.env,
    )
    return 0


def server_unit(ctx: Context, args: argparse.Namespace) -> int:
    from importlib import resources

    sys.stdout.write(resources.files("better_compute.api").joinpath("better-compute.service")
                     .read_text())
    return 0


def register(sub: Any) -> None:
    p = add_verb(sub, "init", init, "Create the store, the sealed PKI bundle and the root tenant; "
                 "print the root administrator's token once.", output=False,
                 examples=["better-compute init --out root-token",
                           "BETTER_COMPUTE_DATABASE_URL=postgresql://bc@db/bc better-compute init"])
    p.add_argument("--out", metavar="FILE", help="write the token to FILE (mode 0600, never overwritten)")
    p = add_verb(sub, "serve", serve, "Serve the API over TLS with a certificate from the serving CA. "
                 "Every flag has a config file key and most an environment variable; a flag "
                 "beats the environment, which beats the file (docs/configuration.md).",
                 output=False, examples=[
                     "better-compute serve --listen 127.0.0.1:8443 --gateway-listen "
                     "127.0.0.1:8444",
                     "better-compute serve --config /etc/better-compute/server.toml",
                     "better-compute serve --log-level info --log-format json "
                     "--metrics-listen 127.0.0.1:9464"])
    p.add_argument("--config", metavar="FILE",
                   help="read settings from this TOML file (default: BETTER_COMPUTE_CONFIG)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="the address to serve on (default 127.0.0.1:8443)")
    p.add_argument("--hostname", action="append", metavar="NAME",
                   help="a name clients use for this server; repeat for several (loopback names "
                   "are added when listening on loopback)")
    p.add_argument("--insecure-loopback", action="store_true",
                   help="serve plain HTTP; allowed only on a loopback address")
    p.add_argument("--gateway-url",
                   help="the agents' gateway URL published in the well-known document "
                   "(default: BETTER_COMPUTE_GATEWAY_URL)")
    p.add_argument("--gateway-listen", metavar="HOST:PORT",
                   help="also serve the agents' gateway (mutual TLS with node certificates) on "
                   "HOST:PORT; its URL is published unless --gateway-url names another")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"],
                   help="the log level on standard error (default warning; info logs one line "
                   "per API request)")
    p.add_argument("--log-format", choices=["text", "json"],
                   help="log lines as text (default) or one JSON object each: time, level, "
                   "logger, message and a request's fields")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="also serve GET /metrics without a token on this loopback address "
                   "(for a Prometheus on this host; docs/metrics.md)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes serving the API on one socket (default: the cores it may "
                   "run on; 1 serves in one process; docs/performance.md)")
    add_verb(sub, "server-unit", server_unit,
             "Print the systemd unit that runs `better-compute serve --config "
             "/etc/better-compute/server.toml` (Type=notify) under its own user.",
             output=False, examples=[
                 "better-compute server-unit | sudo tee /etc/systemd/system/better-compute.service",
                 "sudo systemctl daemon-reload && sudo systemctl enable --now better-compute"])


