# IPython startup file that the book build (_ext/bertbook/measure.py) installs for the kernels it launches.
# After every cell it writes the kernel's peak memory to $BERTBOOK_MEASURE_FILE (set per notebook by the build).
# It prints nothing and never raises: a notebook's outputs are the same with or without it.


def _bertbook_measure() -> None:
    import json
    import os
    import platform
    import resource
    import sys
    import time

    path = os.environ.get("BERTBOOK_MEASURE_FILE")
    if not path:
        return
    started = time.perf_counter()
    cells = [0]

    def cpu_model() -> str:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()

    static = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version()}

    def record(result=None) -> None:
        try:
            cells[0] += 1
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
            peak_mib = peak / 2**20 if sys.platform == "darwin" else peak / 1024
            data = dict(static, peak_rss_mib=round(peak_mib, 1), cells=cells[0],
                        kernel_seconds=round(time.perf_counter() - started, 2))
            torch = sys.modules.get("torch")
            if torch is not None:
                data["torch"] = torch.__version__
                data["torch_threads"] = torch.get_num_threads()
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    data["gpu"] = torch.cuda.get_device_name(0)
                    data["cuda_peak_allocated_mib"] = round(
                        max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())) / 2**20, 1)
            transformers = sys.modules.get("transformers")
            if transformers is not None:
                data["transformers"] = getattr(transformers, "__version__", "?")
            bertlib = sys.modules.get("bertlib")
            if bertlib is not None and hasattr(bertlib, "get_device"):
                device = bertlib.get_device()
                data["device"] = device.type
                data["profile"] = bertlib.get_profile(device)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except Exception:  # measurement must never disturb the notebook
            pass

    get_ipython().events.register("post_run_cell", record)  # noqa: F821 (IPython's builtin)


_bertbook_measure()
del _bertbook_measure
