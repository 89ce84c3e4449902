"""A real ``vllm serve`` of the tiny dummy-weight model for the tests (test_serving,
test_vllm_parallel): fxflops on, in its own process group, stopped with its children."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tests import procs
from tests.helpers import vllm_cache_root
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def scrape(url: str, prefix: str = "fxflops_") -> dict[tuple[str, tuple], float]:
    """A /metrics page, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) if f.name.startswith(prefix)
            for s in f.samples}


class Server:
    """``vllm serve`` of the tiny model in its own process group, fxflops on. ``headless``:
    a node of a multi-node server without an API server (``--headless``): started, not
    waited for (the first node's API server comes up once every node's workers are)."""

    def __init__(self, folder: Path, cc: dict, extra: list[str] = (),
                 env_extra: dict[str, str] | None = None, headless: bool = False) -> None:
        sys.path.insert(0, str(ROOT / "examples"))
        import vllm_tiny

        self.out = folder / "out"
        self.sent: list[int] = []
        self.vllm_metrics: dict[tuple[str, tuple], float] = {}
        self.port = free_port()
        self.model = vllm_tiny.tiny_llama(str(folder / "model"))
        env = {**os.environ, "FXFLOPS": "1", "FXFLOPS_PROMETHEUS": "1",
               "FXFLOPS_OUT": str(self.out), "FXFLOPS_FLUSH_S": "1",
               "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": vllm_cache_root(folder / "cache")}
        for var in ("PROMETHEUS_MULTIPROC_DIR", "FXFLOPS_PROMETHEUS_DIR", "FXFLOPS_RUN_ID"):
            env.pop(var, None)
        env.update(env_extra or {})
        self.log = open(folder / "server.log", "w")
        self.proc = procs.popen(
            [sys.executable, str(ROOT / "scripts" / "vllm_cli.py"), "serve", self.model,
             "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
             "--max-model-len", "512", "--gpu-memory-utilization", "0.3",
             "--max-num-seqs", "8", "-cc", json.dumps(cc), *extra,
             *(["--headless"] if headless else ["--port", str(self.port)])],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=folder)
        if headless:
            return
        deadline = time.time() + 420
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("vllm serve exited: " + self.tail())
            try:
                urllib.request.urlopen(self.url("/health"), timeout=5)
                return
            except OSError:
                time.sleep(2)
        self.stop()
        raise RuntimeError("vllm serve did not come up: " + self.tail())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()

    def tail(self) -> str:
        return self.text()[-3000:]

    def complete(self, lengths: list[int], max_tokens: int = 4) -> int:
        """One request per prompt length, all at once (the engine batches them); prompts
        share no prefix (prefix caching would skip tokens). Returns the tokens the
        scheduler must run: each prompt, then one token per decode step."""
        def send(i: int, n: int) -> None:
            start = 1000 * (len(self.sent) + i + 1)
            body = json.dumps({"model": self.model, "prompt": list(range(start, start + n)),
                               "max_tokens": max_tokens, "ignore_eos": True}).encode()
            req = urllib.request.Request(self.url("/v1/completions"), body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                assert json.loads(r.read())["usage"]["completion_tokens"] == max_tokens

        threads = [threading.Thread(target=send, args=(i, n)) for i, n in enumerate(lengths)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.sent += lengths
        return sum(n + max_tokens - 1 for n in lengths)

    def scrape(self, prefix: str = "fxflops_") -> dict[tuple[str, tuple], float]:
        return scrape(self.url("/metrics"), prefix)

    def settled(self, metrics_url: str | None = None) -> tuple[dict, list[dict]]:
        """/metrics (or another exporter's) and the report once the workers flushed after
        the last request (every second, FXFLOPS_FLUSH_S=1): the two agree on the calls, and
        both are as they were a flush before (a step may still run after a request's
        answer came back; an idle server runs none)."""
        from fxflops.report.files import load_reports

        # only reports written after this call: a flush before the last answer came back
        # (a busy host may hold the workers' flush thread back) would agree with its own
        # metrics and look settled
        since = time.time()
        before = metrics = None
        for _ in range(30):
            time.sleep(1)
            written = [os.path.getmtime(f) for f in glob.glob(os.path.join(self.out, "*.json"))]
            if not written or min(written) < since:
                continue
            try:
                reports = load_reports([self.out])
            except Exception:  # no report yet
                continue
            metrics = scrape(metrics_url) if metrics_url else self.scrape()
            calls = sum(r["calls"] for rep in reports for r in rep["forward"])
            agree = calls and calls == sum(v for (name, _), v in metrics.items()
                                           if name == "fxflops_forward_calls_total")
            if agree and metrics == before:
                return metrics, reports
            before = metrics if agree else None
        changing = sorted(k for k in (metrics or {}) if before and before.get(k) != metrics[k])
        raise AssertionError(f"metrics never matched the report (changing: {changing[:5]}): "
                             + self.tail())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def process_labels(report: dict) -> dict[str, str]:
    """A process's labels: its rank, and its data, pipeline and tensor-parallel ranks and
    node, as its report has them."""
    ranks = report["process"].get("ranks") or {}
    return {"rank": str(report["process"].get("rank") or 0),
            **{k: str(ranks[k]) for k in ("dp", "pp", "tp", "node") if k in ranks}}
