"""NumPy's BLAS thread count, held for the model loops of gqa's commands."""


class blas_threads:
    """Context manager: NumPy's BLAS (OpenBLAS) limited to `n` threads, where that can be
    done (threadpoolctl, else OpenBLAS's own setter found among the loaded libraries).

    Why: after each matrix product OpenBLAS's worker threads keep spinning for a while; on a
    small machine they then take the cores that the attention call's OpenMP threads need
    (and the attention's threads, spinning in turn, slow the next product).  The projections
    of this demo are small enough for one thread.  `.how` says what was done."""

    _NAMES = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
              "openblas_set_num_threads64_", "openblas_set_num_threads")

    def __init__(self, n):
        self.n, self.how, self._undo = n, "unchanged (no OpenBLAS found)", None

    def __enter__(self):
        try:
            from threadpoolctl import threadpool_limits
            lim = threadpool_limits(self.n, user_api="blas")
            self._undo, self.how = lim.restore_original_limits, f"{self.n} thread (threadpoolctl)"
            return self
        except Exception:  # noqa: BLE001  (threadpoolctl is optional)
            pass
        try:
            import ctypes
            libs = set()
            with open("/proc/self/maps") as f:
                for line in f:
                    path = line.split()[-1]
                    if "openblas" in path.lower() and ".so" in path:
                        libs.add(path)
            for path in sorted(libs):
                lib = ctypes.CDLL(path)
                for name in self._NAMES:
                    setter = getattr(lib, name, None)
                    getter = getattr(lib, name.replace("set_num", "get_num"), None)
                    if setter is None or getter is None:
                        continue
                    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                    before = getter()
                    setter(self.n)
                    self._undo = lambda s=setter, b=before: s(b)
                    self.how = f"{self.n} thread (OpenBLAS, was {before})"
                    return self
        except Exception:  # noqa: BLE001  (not Linux, or no such library: leave BLAS alone)
            pass
        return self

    def __exit__(self, *exc):
        if self._undo is not None:
            self._undo()
        return False
