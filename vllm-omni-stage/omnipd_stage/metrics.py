"""The worker's Prometheus metrics, written in the text exposition format.

A few counters and gauges, owned by one object so that every call site
records through a named method: requests by endpoint and status, engine
aborts the worker asked for, conditioning stashes held (the gauge the
reference worker exports under the same name), and the Talker's stash
reads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Counters of one worker. Single-threaded: the event loop owns it."""

    def __init__(self, stage: str, model: str) -> None:
        self._stage = stage
        self._model = model
        self._requests: dict[tuple[str, str], int] = defaultdict(int)
        self._aborts = 0
        self._conditioning_reads = 0
        self._conditioning_rows = 0
        self._conditioning_waits = 0
        self._conditioning_wait_s = 0.0
        self._frames = 0
        self._samples = 0
        self._stashes: Callable[[], int] = lambda: 0
        self._waiting: Callable[[], int] = lambda: 0
        self._running: Callable[[], int] = lambda: 0

    def watch_stashes(self, count: Callable[[], int], waiting: Callable[[], int]) -> None:
        self._stashes = count
        self._waiting = waiting

    def watch_running(self, count: Callable[[], int]) -> None:
        self._running = count

    def record_request(self, endpoint: str, status: int) -> None:
        self._requests[(endpoint, str(status))] += 1

    def record_abort(self) -> None:
        self._aborts += 1

    def record_conditioning_read(self, rows: int, waited: bool, seconds: float) -> None:
        self._conditioning_reads += 1
        self._conditioning_rows += rows
        if waited:
            self._conditioning_waits += 1
            self._conditioning_wait_s += seconds

    def record_frames(self, n: int) -> None:
        self._frames += n

    def record_samples(self, n: int) -> None:
        self._samples += n

    @property
    def aborts(self) -> int:
        return self._aborts

    def render(self) -> str:
        labels = f'stage="{_escape(self._stage)}",model_name="{_escape(self._model)}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for extra, value in samples:
                lab = labels + ("," + extra if extra else "")
                out.append(f"{name}{{{lab}}} {_num(value)}")

        metric("omnipd_stage_requests_total", "counter", "Requests answered, by endpoint and HTTP status.",
               [(f'endpoint="{_escape(e)}",status="{s}"', n) for (e, s), n in sorted(self._requests.items())])
        metric("omnipd_stage_engine_aborts_total", "counter",
               "Engine requests the worker aborted (client gone, stopped early, failed).", [("", self._aborts)])
        metric("omnipd_stage_engine_requests_running", "gauge", "Engine requests in flight.",
               [("", self._running())])
        if self._stage == "thinker":
            # vLLM's own gauge, as a vllm serve Thinker's /metrics carries it
            # (vllm/v1/metrics/loggers.py).
            metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   [("", self._running())])
        metric("omnipd_conditioning_stashes", "gauge", "Conditioning stashes held for a Talker to fetch.",
               [("", self._stashes())])
        if self._stage == "thinker":
            metric("omnipd_conditioning_reads_waiting", "gauge",
                   "Streamed stash reads held open for rows the Thinker has not computed yet.",
                   [("", self._waiting())])
        if self._stage == "talker":
            metric("omnipd_talker_conditioning_reads_total", "counter", "Streamed conditioning reads.",
                   [("", self._conditioning_reads)])
            metric("omnipd_talker_conditioning_rows_total", "counter", "Conditioning rows read.",
                   [("", self._conditioning_rows)])
            metric("omnipd_talker_conditioning_waits_total", "counter",
                   "Streamed reads that found the Thinker behind (vllm-omni's WAITING_FOR_CHUNK).",
                   [("", self._conditioning_waits)])
            metric("omnipd_talker_conditioning_wait_seconds_total", "counter",
                   "Time spent in reads that waited for the Thinker.", [("", self._conditioning_wait_s)])
            metric("omnipd_talker_frames_total", "counter", "Codec frames streamed.", [("", self._frames)])
        if self._stage == "code2wav":
            metric("omnipd_code2wav_samples_total", "counter", "Audio samples returned.", [("", self._samples)])
        return "\n".join(out) + "\n"


def _num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))
