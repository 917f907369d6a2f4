"""deepspeed.runtime paths that programs import directly (lr_schedules, utils); the engine itself is dsfast.engine."""
