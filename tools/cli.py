"""The ``sapgrid`` command: serve, demo, worlds, replay, bench, view, cluster, auth.

    sapgrid serve [--listen HOST:PORT] [--data-dir DIR] ...         run a server (flags or SAPGRID_* env)
    sapgrid demo [--server HOST:PORT | --spawn-server] [--ticks N]  live simulation against a server
    sapgrid worlds [NAME] | create|delete NAME | snapshot NAME FILE | restore FILE [--name NEW]
                                                                    list, show and manage worlds
    sapgrid replay TRACE [--server HOST:PORT]                       replay a recorded trace
    sapgrid bench [--server HOST:PORT|spawn]                        benchmarks (engine, or the service)
    sapgrid view [--server HOST:PORT] [--world NAME] [--listen HOST:PORT]  live web viewer of worlds
    sapgrid cluster status|proxy-config|rebalance ...               a cluster of replicas behind HAProxy
    sapgrid auth token --file FILE --name NAME --role admin|writer|reader --worlds PATTERN   a new token

Every command that calls a server takes --tls, --tls-ca FILE, --tls-cert FILE, --tls-key FILE and
--token TOKEN, or SAPGRID_TLS, SAPGRID_TLS_CA, SAPGRID_TLS_CERT, SAPGRID_TLS_KEY, SAPGRID_TOKEN.
"""
from __future__ import annotations

import argparse
import sys

from sapgrid import DEFAULT_ADDRESS as DEFAULT_SERVER


def _add_server(parser: argparse.ArgumentParser, default: str | None = DEFAULT_SERVER) -> None:
    if "--server" not in parser._option_string_actions:
        parser.add_argument("--server", default=default, metavar="HOST:PORT",
                            help=f"sapgrid server address (default {default or 'none: in process'})")


def _cmd_serve(args) -> int:
    try:
        from sapgrid.server.app import serve  # noqa: F401  (the server and the engine are the server extra)
    except ImportError as exc:
        print(f"sapgrid serve needs the server: pip install 'sapgrid[server]' ({exc})", file=sys.stderr)
        return 2
    from sapgrid.server.main import run

    return run(args)


def _cmd_view(args) -> int:
    from sapgrid.tools.viewer import run

    return run(args.server, args.world, args.listen)


WORLDS_ACTIONS = ("list", "create", "delete", "snapshot", "restore")


def _cmd_worlds(args) -> int:
    from sapgrid.client import Client
    from sapgrid.client.errors import SapgridError

    if args.action not in WORLDS_ACTIONS:       # sapgrid worlds NAME: the same as sapgrid worlds list NAME
        if args.name is not None:
            print(f"sapgrid worlds: unknown action {args.action!r} (one of {', '.join(WORLDS_ACTIONS)}, or a "
                  f"world's NAME alone)", file=sys.stderr)
            return 2
        args.action, args.name = "list", args.action

    with Client(args.server, timeout=args.timeout) as c:
        try:
            if args.action in ("create", "delete") and (not args.name or args.file):
                print(f"sapgrid worlds {args.action} NAME: one world name is needed", file=sys.stderr)
                return 2
            if args.action == "create":
                try:
                    bounds = tuple(float(x) for x in args.bounds.split(",")) if args.bounds else None
                except ValueError:
                    print(f"sapgrid worlds create: --bounds {args.bounds!r}: not a comma-separated list of numbers",
                          file=sys.stderr)
                    return 2
                try:
                    cells = tuple(int(x) for x in args.cells.split(",")) if args.cells else None
                except ValueError:
                    print(f"sapgrid worlds create: --cells {args.cells!r}: not a comma-separated list of integers",
                          file=sys.stderr)
                    return 2
                w = c.create_world(args.name, dims=args.dims, bounds=bounds, cells=cells,
                                   expected_objects=args.expected_objects)
                print(f"created {w.name}: dims={w.config.dims} bounds={w.config.bounds} cells={w.config.cells}")
            elif args.action == "delete":
                c.delete_world(args.name)
                print(f"deleted {args.name}")
            elif args.action == "snapshot":
                if not args.name or not args.file:
                    print("sapgrid worlds snapshot NAME FILE: both are needed", file=sys.stderr)
                    return 2
                data = c.snapshot(args.name)
                try:
                    _write_atomically(args.file, data)
                except OSError as exc:
                    print(f"sapgrid worlds snapshot: {args.file}: cannot write it ({exc.strerror or exc})",
                          file=sys.stderr)
                    return 2
                print(f"snapshot of {args.name}: {len(data)} bytes in {args.file}")
            elif args.action == "restore":
                path = args.name              # sapgrid worlds restore FILE [--name NEW]
                if not path or args.file:
                    print("sapgrid worlds restore FILE [--name NEW]", file=sys.stderr)
                    return 2
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError as exc:
                    print(f"sapgrid worlds restore: {path}: cannot read it ({exc.strerror or exc})", file=sys.stderr)
                    return 2
                w = c.restore(data, args.new_name)
                print(f"restored {w.name}: {w.objects} objects, {w.pairs} pairs, frame {w.frames}")
            else:
                worlds = [c.get_world(args.name)] if args.name else c.list_worlds()
                print(f"{'world':<20} {'dims':>4} {'cells':>12} {'objects':>10} {'pairs':>10} {'frames':>8} "
                      f"{'last ms':>8} {'writers':>7}")
                for w in worlds:
                    last = f"{w.last_frame.total_s * 1e3:.2f}" if w.last_frame else "-"
                    print(f"{w.name:<20} {w.config.dims:>4} {'x'.join(map(str, w.config.cells)):>12} "
                          f"{w.objects:>10} {w.pairs:>10} {w.frames:>8} {last:>8} {len(w.writers):>7}"
                          f"{'  frozen' if w.frozen else ''}")
                if args.name:                   # one world: its digest, state and where each writer stands
                    w = worlds[0]
                    print(f"pairs digest {w.pairs_digest} ({w.pairs_digest:#018x}); "
                          f"{'frozen (frames refused: moving)' if w.frozen else 'not frozen'}; "
                          f"rejected frames {w.frames_rejected}")
                    for writer, seq in sorted(w.writers.items()):
                        print(f"writer {writer}: last applied seq {seq}")
        except SapgridError as exc:
            print(f"sapgrid worlds: {exc}", file=sys.stderr)
            return 1
    return 0


def _write_atomically(path: str, data: bytes) -> None:
    """Write a file whole or not at all (a temporary file beside it, renamed over it)."""
    import os
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".sapgrid-snapshot-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _cmd_demo(args) -> int:
    from sapgrid.tools import demo

    return demo.run(args)


def _cmd_replay(args) -> int:
    from sapgrid.tools import replay

    return replay.run(args)


def _cmd_bench(args) -> int:
    if args.proxy_scale:
        from sapgrid.tools import bench_cluster

        return bench_cluster.main(["--scale", args.proxy_scale, "--worlds", str(args.worlds or 64), "--objects",
                                   str(args.objects), "--seconds", str(args.seconds)] + (["--json"] if args.json else []))
    if args.proxy:
        from sapgrid.tools import bench_cluster

        return bench_cluster.main(["--objects", str(args.proxy_objects), "--frames", str(args.proxy_frames)]
                                  + (["--json"] if args.json else []))
    import grpc

    from sapgrid.client.errors import SapgridError
    from sapgrid.tools import bench

    try:
        return bench.run(args)
    except SapgridError as exc:                 # e.g. --server not reachable, or a call it refused
        print(f"sapgrid bench: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:                # the echo baseline's raw stub
        hint = (" (the server does not serve the bench-only EchoService: start it with `sapgrid serve --echo`, "
                "or use --server spawn)" if exc.code() == grpc.StatusCode.UNIMPLEMENTED else "")
        print(f"sapgrid bench: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
        return 1


def _cmd_auth(args) -> int:
    from sapgrid.server.auth import ROLES_HELP, AuthFileError, append_token

    try:
        token = append_token(args.file, args.name, args.role, args.worlds)
    except AuthFileError as exc:
        print(f"sapgrid auth token: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:                      # e.g. the file's directory is missing or not writable
        print(f"sapgrid auth token: --file {args.file}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"sapgrid auth token needs the server: pip install 'sapgrid[server]' ({exc})", file=sys.stderr)
        return 2
    print(f"appended {args.name!r} ({args.role} on {args.worlds}: {ROLES_HELP[args.role]}) to {args.file} as a "
          f"SHA-256 hash; send SIGHUP to the server to load it. The token, shown only now:\n{token}")
    return 0


#: Client credentials of every command that calls a server: (flag, env, help).
CLIENT_CREDENTIALS = (
    ("--tls", "SAPGRID_TLS", "TLS with the system's root certificates"),
    ("--tls-ca", "SAPGRID_TLS_CA", "TLS: the server's CA certificate (PEM)"),
    ("--tls-cert", "SAPGRID_TLS_CERT", "mutual TLS: this client's certificate (PEM)"),
    ("--tls-key", "SAPGRID_TLS_KEY", "mutual TLS: this client's private key (PEM)"),
    ("--token", "SAPGRID_TOKEN", "bearer token (sent as authorization metadata)"),
)


def _add_credentials(parser: argparse.ArgumentParser) -> None:
    """The client credential options, on this parser and every sub-command below it (but serve and auth)."""
    for flag, env, text in CLIENT_CREDENTIALS:
        if flag not in parser._option_string_actions:
            if flag == "--tls":
                parser.add_argument(flag, action="store_const", const=True, default=argparse.SUPPRESS,
                                    help=f"{text} (or {env}=1)")
            else:
                parser.add_argument(flag, default=argparse.SUPPRESS, metavar="FILE" if flag != "--token" else "TOKEN",
                                    help=f"{text} (or {env})")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if name not in ("serve", "auth"):
                    _add_credentials(child)


def _apply_credentials(args, env) -> None:
    """Flags over SAPGRID_* variables: the credentials of every client this command makes."""
    if args.command in ("serve", "auth"):
        return
    from sapgrid.client._channel import set_defaults

    values = {}
    for flag, name, _ in CLIENT_CREDENTIALS:
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest, None)
        if value is None:
            value = env.get(name) or None
            if flag == "--tls" and value is not None:
                value = value.strip().lower() in ("1", "true", "yes", "on")
        values[dest] = value
        if value and flag in ("--tls-ca", "--tls-cert", "--tls-key"):
            _check_pem(value, f"{flag} {value}" if getattr(args, dest, None) is not None else f"{name}={value}")
    if bool(values["tls_cert"]) != bool(values["tls_key"]):
        raise ValueError("--tls-cert and --tls-key go together (a client certificate and its private key)")
    set_defaults(tls=bool(values["tls"]), ca_file=values["tls_ca"], cert_file=values["tls_cert"],
                 key_file=values["tls_key"], token=values["token"])


def _check_pem(path: str, label: str) -> None:
    """A credential file must be readable PEM before any call is made (else one line naming it, exit 2)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{label}: not a PEM file")


def _engine_tool(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the options of a tool that imports the engine; with the client-only install (no ``server``
    extra) the command is still listed, and running it says what to install."""
    import importlib

    try:
        importlib.import_module(f"sapgrid.tools.{name}").add_arguments(parser)
    except ImportError as exc:
        parser.add_argument("ignored", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        parser.set_defaults(missing=f"sapgrid {name} needs the engine: pip install 'sapgrid[server]' ({exc})")


def build_parser() -> argparse.ArgumentParser:
    from sapgrid import __version__

    ap = argparse.ArgumentParser(prog="sapgrid", description="sapgrid: a networked broadphase service",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--version", action="version", version=f"sapgrid {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run a sapgrid server (flags override SAPGRID_* environment variables)")
    from sapgrid.server.config import add_arguments as server_arguments

    server_arguments(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("demo", help="live simulation of moving boxes against a server")
    from sapgrid.tools import demo

    demo.add_arguments(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("worlds", help="list, show, create, delete, snapshot or restore worlds",
                       epilog="sapgrid worlds snapshot NAME FILE: save a world's snapshot; "
                              "sapgrid worlds restore FILE [--name NEW]: create a world from one")
    p.add_argument("action", nargs="?", default="list", metavar="ACTION|NAME",
                   help="list (default), create, delete, snapshot or restore; a world's NAME alone shows that "
                        "world with its pairs digest, frozen state and writers (as `list NAME`)")
    p.add_argument("name", nargs="?", default=None,
                   help="world name (create/delete/snapshot; list: show one); restore: the snapshot FILE")
    p.add_argument("file", nargs="?", default=None, help="snapshot: the file written")
    p.add_argument("--name", dest="new_name", default=None, help="restore: the restored world's name "
                   "(default: the snapshot's)")
    p.add_argument("--dims", type=int, default=2, help="create: 2 or 3 (default 2)")
    p.add_argument("--bounds", default=None, help="create: mins then maxs, e.g. 0,0,1000,1000 (default 0..1000)")
    p.add_argument("--cells", default=None, help="create: cells per axis, e.g. 16,16 (default: server picks)")
    p.add_argument("--expected-objects", type=int, default=0, help="create: size the grid for N objects")
    p.add_argument("--timeout", type=float, default=30.0, help="call deadline, seconds (default 30)")
    _add_server(p)
    p.set_defaults(func=_cmd_worlds)

    p = sub.add_parser("replay", help="replay a recorded trace (in process, or --server)")
    _engine_tool("replay", p)
    _add_server(p, default=None)
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("bench", help="benchmarks: the engine in process, or the service with --server")
    _engine_tool("bench", p)
    _add_server(p, default=None)
    from sapgrid.tools import bench_server

    bench_server.add_arguments(p)
    from sapgrid.tools import bench_worlds

    bench_worlds.add_arguments(p)
    p.add_argument("--proxy", action="store_true",
                   help="the cluster proxy's added round trip: a replica direct vs through HAProxy")
    p.add_argument("--proxy-objects", type=int, default=10_000, help="objects per frame for --proxy (default 10000)")
    p.add_argument("--proxy-frames", type=int, default=600, help="frames each way for --proxy (default 600)")
    p.add_argument("--proxy-scale", default="", metavar="R,R,...",
                   help="aggregate frames/s through HAProxy with R replicas each (e.g. 1,2,3): --worlds (default "
                        "64) worlds of --objects objects, one stream each, frames back to back for --seconds")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("view", help="live web viewer of a server's worlds (boxes, pairs, stats)")
    _add_server(p)
    p.add_argument("--world", default="", help="world shown first (default: the first one)")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="address of the viewer's web page (default 127.0.0.1:8080)")
    p.set_defaults(func=_cmd_view)

    from sapgrid.tools import cluster

    cluster.add_parser(sub)

    p = sub.add_parser("auth", help="credentials of a server's --auth-file")
    asub = p.add_subparsers(dest="auth_command", required=True)
    t = asub.add_parser("token", help="make a token: append its entry (SHA-256 hash only) to the auth file and "
                                      "print the token once, as the last word")
    t.add_argument("--file", required=True, help="the server's --auth-file (TOML; created if missing)")
    t.add_argument("--name", required=True, help="the token's name (audit lines, quotas, metrics)")
    t.add_argument("--role", required=True, choices=("admin", "writer", "reader"),
                   help="admin: everything; writer: frames, snapshots and reads; reader: get, query, pairs, subscribe")
    t.add_argument("--worlds", default="*", help="world-name pattern the role covers, e.g. 'match-*' (default *)")
    t.set_defaults(func=_cmd_auth)

    _add_credentials(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    import os

    # gRPC's core logs a failed TLS handshake at INFO on stderr; the command's own one-line error says it.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = build_parser().parse_args(argv)
    if getattr(args, "missing", None):
        print(args.missing, file=sys.stderr)
        return 2
    try:
        _apply_credentials(args, os.environ)
    except ValueError as exc:
        print(f"sapgrid {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                     # e.g. `sapgrid worlds | head -3`: the reader has gone
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # no second error when Python flushes stdout at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
