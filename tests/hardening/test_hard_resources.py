"""100,000 decode-loop calls (in a subprocess, _leak_worker.py) keep resident memory flat and
leak no file descriptors, OS threads or Python threads.  The calls cycle through every path
that allocates (in-place decode, fresh present buffers, flash decoding partials, flash tiles,
naive scratch) and the error path."""
from _subproc import run_worker, scaled

CALLS = 100_000
RSS_SLACK_KIB = 4 * 1024      # "flat within a few MiB"


def test_100k_calls_leak_nothing(tmp_path):
    n = scaled(CALLS)
    s = run_worker("_leak_worker.py", ["--calls", str(n), "--warmup", "5000"], tmp_path, timeout=600)
    before, after = s["before"], s["after"]
    grew = after["rss_kib"] - before["rss_kib"]
    assert grew <= RSS_SLACK_KIB, f"RSS grew by {grew} KiB over {n} calls (samples {s['rss_samples_kib']})"
    assert after["fds"] == before["fds"], (before, after)
    assert after["os_threads"] == before["os_threads"], (before, after)
    assert after["py_threads"] == before["py_threads"] == 1, (before, after)
