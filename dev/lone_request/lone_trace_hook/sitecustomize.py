"""dev/lone_request/lone_trace.py's timers, installed in every Python process it starts (this directory is
put first on PYTHONPATH with $ISTANBUL_LONE_TRACE set to a directory): the service's workers
and its GPU process mark named moments with time.perf_counter_ns() (CLOCK_MONOTONIC: one
clock for every process of the host) into DIR/<pid>.txt. Without $ISTANBUL_LONE_TRACE, only
the variants' patches ($ISTANBUL_LONE_TRACE_KEEPER=blocking, $ISTANBUL_LONE_TRACE_MAP=block:
the code before session 25) apply, for bench/service.py A/Bs (dev/lone_request/lone_next.sh). A
measurement, not a product path.
"""

import os

DIR = os.environ.get("ISTANBUL_LONE_TRACE")
VARIANT = os.environ.get("ISTANBUL_LONE_TRACE_KEEPER") or os.environ.get("ISTANBUL_LONE_TRACE_MAP")

if DIR or VARIANT:
    import functools
    import importlib.abc
    import importlib.machinery
    import sys
    import time

    _marks: list = []
    _clock = time.perf_counter_ns

    def mark(name: str) -> None:
        if not DIR:
            return
        _marks.append((name, _clock()))
        if len(_marks) >= 32:   # a spawned child ends with os._exit: no atexit, flush often
            flush()

    def flush() -> None:
        if _marks and DIR:
            with open(os.path.join(DIR, f"{os.getpid()}.txt"), "a") as f:
                f.writelines(f"{n} {t}\n" for n, t in _marks)
            _marks.clear()

    import atexit
    atexit.register(flush)

    def around(cls, name: str, before, after: str | None) -> None:
        """Mark `before` (a name or names) as cls.name is called and `after` as it returns."""
        before = (before,) if isinstance(before, str) else before
        fn = getattr(cls, name)
        if hasattr(fn, "__lone_traced__"):
            return
        import inspect
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def wrapped(*args, **kwargs):
                for name in before or ():
                    mark(name)
                try:
                    return await fn(*args, **kwargs)
                finally:
                    if after:
                        mark(after)
        else:
            @functools.wraps(fn)
            def wrapped(*args, **kwargs):
                for name in before or ():
                    mark(name)
                try:
                    return fn(*args, **kwargs)
                finally:
                    if after:
                        mark(after)
        wrapped.__lone_traced__ = True
        setattr(cls, name, wrapped)

    def patch_servicer(mod):
        if not DIR:
            return
        around(mod.TokenizerServicer, "Tokenize", "W0_servicer_in", "W3_servicer_out")

    def patch_gpu_host(mod):
        if not DIR:
            return
        around(mod.RemoteEncoding, "call_async", "W1_call_out", "W2_call_back")
        around(mod.GpuHost, "_round", "G1_round", None)
        around(mod.GpuHost, "_begin", None, "G2_submitted")
        around(mod.GpuHost, "_finish", "G3_finish", None)
        around(mod.GpuHost, "_answer_call", "G4_ids_ready", "G5_answered")
        # overlap off: the call submitted and finished in one
        around(mod.GpuHost, "_encode", ("G2_submitted", "G3_finish"), None)

    def patch_keeper(mod):
        if os.environ.get("ISTANBUL_LONE_TRACE_KEEPER") == "blocking":
            # the keeper before 2026-12-05 (session 25): each spin submitted and waited for
            def spin(self):
                if not self.holding():
                    return
                self.device.run(self.kernel, [self.out, self.params], 1, "clock keeper")
                self.device.sync()
                self.spins += 1
            mod.ClockKeeper.spin = spin
        if DIR:
            around(mod.ClockKeeper, "spin", "S0_spin", "S1_spun")

    def patch_scan(mod):
        if os.environ.get("ISTANBUL_LONE_TRACE_MAP") == "block":
            mod.MAP_POLL_S = 0.0   # the staging map as before session 25: no polling first

    def patch_selectors(mod):
        sel = mod.DefaultSelector
        select = sel.select
        if hasattr(select, "__lone_traced__"):
            return

        @functools.wraps(select)
        def traced(self, timeout=None):
            ready = select(self, timeout)
            if ready:
                mark("G0_readable")
            return ready
        traced.__lone_traced__ = True
        sel.select = traced

    PATCHES = {"tokenizer_svc.server.servicer": patch_servicer,
               "tokenizer_svc.server.gpu_host": patch_gpu_host,
               "tokenizer_svc.server.clock_keeper": patch_keeper,
               "tokenizer_svc.gpu_scan": patch_scan}

    class _After(importlib.abc.MetaPathFinder):
        """Runs a module's patch right after the module is executed."""

        def find_spec(self, fullname, path, target=None):
            if fullname not in PATCHES:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader, patch = spec.loader, PATCHES[fullname]
            exec_module = loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)
            loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, _After())
    # only the GPU process's loop selects with the selectors module (the workers run uvloop)
    if DIR and os.environ.get("ISTANBUL_LONE_TRACE_SELECT", "1") == "1":
        import selectors
        patch_selectors(selectors)
