"""deepspeed.utils.timer: ThroughputTimer, the samples/s counter every DeepSpeed engine holds as `engine.tput_timer`,
and SynchronizedWallClockTimer, the named stopwatches Megatron-style programs time their phases with
(`timers("forward").start()`, `.stop()`, `timers.log(["forward"])`; NoopTimer takes the same calls and times nothing).

Programs call `engine.tput_timer.update_epoch_count()` after each epoch (DeepSpeed-Chat) and read its counters or
`avg_samples_per_sec()`. The engine starts it in forward and stops it in step; steps before `start_step` are not
timed (warm-up). `config` is the `timers.throughput` section (`enabled`, `synchronized`: wait for the device before
reading the clock). It logs a throughput line every `steps_per_output` optimizer steps through `logging_fn` when one
is given; the engine gives none (dsfast's progress line already reports samples/s).
"""
import time

from ..accelerator.cuda import synchronize_if_used
from .log import log_dist

_EPS = 1e-12


class ThroughputTimer:
    def __init__(self, config=None, batch_size=1, start_step=2, steps_per_output=None, monitor_memory=False,
                 logging_fn=None):
        if monitor_memory:
            raise ValueError("ThroughputTimer(monitor_memory=True) is not supported by dsfast (it needs psutil "
                             "and only adds a host-memory line to the log); pass monitor_memory=False")
        self.config = config
        self.enabled = bool(getattr(config, "enabled", True))
        self.synchronized = bool(getattr(config, "synchronized", True))
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step = start_step
        self.steps_per_output = steps_per_output
        self.monitor_memory = False
        self.logging = logging_fn
        self.epoch_count = self.micro_step_count = self.global_step_count = 0
        self.total_elapsed_time = self.step_elapsed_time = 0.0
        self.start_time = self.end_time = 0.0
        self.started = self.initialized = False

    def update_epoch_count(self):
        """One more epoch done: the epoch counter goes up and the micro-step counter starts again."""
        self.epoch_count += 1
        self.micro_step_count = 0

    def _clock(self):
        return _now(self.synchronized)

    def start(self):
        if not self.enabled:
            return
        self.initialized = self.started = True
        if self.global_step_count >= self.start_step:
            self.start_time = self._clock()

    def stop(self, global_step=False, report_speed=True):
        """End a micro step (an optimizer step too when `global_step`)."""
        if not self.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time <= 0:
            return
        self.end_time = self._clock()
        elapsed = self.end_time - self.start_time
        self.total_elapsed_time += elapsed
        self.step_elapsed_time += elapsed
        if not global_step:
            return
        if report_speed and self.logging is not None and self.steps_per_output and \
                self.global_step_count % self.steps_per_output == 0:
            self.logging(f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/global_step="
                         f"{self.global_step_count}, RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
                         f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + _EPS)}")
        self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self):
        """Samples per second over the timed optimizer steps; -inf before any step."""
        timed = self.global_step_count - self.start_step
        if self.global_step_count > 0 and timed > 0 and self.total_elapsed_time > 0:
            return self.batch_size / (self.total_elapsed_time / timed)
        return float("-inf")


def _now(synchronized=True):
    """Wall-clock seconds, after the device's queued work where `synchronized` (what a timer must measure)."""
    if synchronized:
        synchronize_if_used()
    return time.time()


class _Stopwatch:
    """One named timer: start / stop around a phase (the device synchronized first), elapsed in milliseconds."""

    def __init__(self, name):
        self.name = name
        self.started = False
        self.start_time = 0.0
        self.total_ms = 0.0
        self.records = []        # each start-stop interval, for mean()

    def start(self):
        if self.started:
            raise RuntimeError(f"timer {self.name!r} is already running: stop() it before start()")
        self.start_time = _now()
        self.started = True

    def stop(self, reset=False, record=False):
        if not self.started:
            raise RuntimeError(f"timer {self.name!r} is not running: start() it before stop()")
        ms = (_now() - self.start_time) * 1000.0
        self.started = False
        if reset:
            self.total_ms = 0.0
        self.total_ms += ms
        if record:
            self.records.append(ms)

    def reset(self):
        self.started = False
        self.total_ms = 0.0
        self.records = []

    def elapsed(self, reset=True):
        """Milliseconds timed so far (a running timer counts up to now and keeps running)."""
        running = self.started
        if running:
            self.stop()
        ms = self.total_ms
        if reset:
            self.reset()
        if running:
            self.start()
        return ms

    def mean(self):
        return sum(self.records) / len(self.records) if self.records else 0.0


class SynchronizedWallClockTimer:
    """Named stopwatches made on first use: `timers(name)` gives the one of that name."""

    def __init__(self):
        self.timers = {}

    def __call__(self, name):
        if name not in self.timers:
            self.timers[name] = _Stopwatch(name)
        return self.timers[name]

    def get_timers(self):
        return self.timers

    def has(self, name):
        return name in self.timers

    def log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
        """Print "time (ms) | name: ms | ..." for the named timers that exist (each divided by `normalizer`), on
        `ranks` (default rank 0) through deepspeed.utils.log_dist."""
        if not normalizer > 0.0:
            raise ValueError(f"normalizer={normalizer!r}: give a positive number to divide the times by")
        parts = [f"{n}: {self.timers[n].elapsed(reset=reset) / normalizer:.2f}" for n in names if n in self.timers]
        if parts:
            log_dist("time (ms) | " + " | ".join(parts), ranks=ranks or [0])

    def get_mean(self, names, normalizer=1.0, reset=True):
        """{name: mean recorded interval / normalizer} for the named timers that exist."""
        means = {n: self.timers[n].mean() / normalizer for n in names if n in self.timers}
        if reset:
            for n in means:
                self.timers[n].reset()
        return means


class NoopTimer:
    """SynchronizedWallClockTimer's calls, timing nothing (DeepSpeed's engine holds one without wall_clock_breakdown)."""

    class _Noop:
        def start(self, *args, **kwargs):
            pass

        def stop(self, *args, **kwargs):
            pass

        def reset(self):
            pass

        def elapsed(self, reset=True):
            return 0.0

        def mean(self):
            return 0.0

    _timer = _Noop()

    def __call__(self, name):
        return self._timer

    def get_timers(self):
        return {}

    def has(self, name):
        return False

    def log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
        pass

    def get_mean(self, names, normalizer=1.0, reset=True):
        return {}
