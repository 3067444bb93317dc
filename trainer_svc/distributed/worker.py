"""A rank process (ranks 1..N-1 of a job's group); started by launch.py, not by users.

    python -m trainer_svc.distributed.worker --rank 1 --world 2 --port PORT --adapter 1

Opens its own device, says it is ready through the store, joins the group and follows rank
0's commands (data_parallel.serve_rank). Exits when rank 0 says "stop" (0), when rank 0 goes
away (its stdin pipe closes, or a collective fails: 1), or on an error, which it leaves in the
store for rank 0 first.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import threading


def _exit_when_parent_goes() -> None:
    """Rank 0 holds our stdin: EOF means it exited or closed us; stop at once."""
    def watch():
        try:
            while sys.stdin.buffer.read(1):
                pass
        finally:
            os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer_svc.distributed.worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True, help="rank 0's store on 127.0.0.1")
    p.add_argument("--adapter", default=None)
    p.add_argument("--backend", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"rank {args.rank}: %(levelname)s %(message)s")
    _exit_when_parent_goes()

    from .data_parallel import serve_rank
    from .group import JOIN_TIMEOUT_S, RankGroup, report_error, torch_distributed
    from .launch import READY_KEY
    _, dist = torch_distributed()
    store = dist.TCPStore("127.0.0.1", args.port, args.world, False,
                          timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    group = None
    try:
        from istanbul.shaders.engine import Device
        device = Device(args.adapter, args.backend, robustness=False)
        logging.info("device %s", device.info.summary())
        store.set(READY_KEY.format(rank=args.rank), "1")
        group = RankGroup.create(args.rank, args.world, store=store)
        serve_rank(group, device)
    except BaseException as exc:
        report_error(store, args.rank, exc)
        logging.exception("rank %d stops", args.rank)
        return 1
    finally:
        if group is not None:
            group.close()
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    # not sys.exit: interpreter shutdown would trip over the thread blocked reading stdin
    os._exit(code)
