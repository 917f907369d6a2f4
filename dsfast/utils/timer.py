"""deepspeed.utils.timer.ThroughputTimer: the samples/s counter every DeepSpeed engine holds as `engine.tput_timer`.

Programs call `engine.tput_timer.update_epoch_count()` after each epoch (DeepSpeed-Chat) and read its counters or
`avg_samples_per_sec()`. The engine starts it in forward and stops it in step; steps before `start_step` are not
timed (warm-up). `config` is the `timers.throughput` section (`enabled`, `synchronized`: wait for the device before
reading the clock). It logs a throughput line every `steps_per_output` optimizer steps through `logging_fn` when one
is given; the engine gives none (dsfast's progress line already reports samples/s).
"""
import time

from ..accelerator.cuda import synchronize_if_used

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
        if self.synchronized:
            synchronize_if_used()
        return time.time()

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
