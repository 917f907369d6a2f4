"""add_config_arguments: DeepSpeed's command-line flags (and dsfast aliases) on a user's argparse parser."""
import argparse


def _has(parser, flag):
    return any(flag in action.option_strings for action in parser._actions)


def add_config_arguments(parser):
    """Add --deepspeed / --deepspeed_config (aliases --dsfast / --dsfast_config) to `parser`; return it.

    Both spellings fill `args.deepspeed` and `args.deepspeed_config`. --local_rank is deliberately not added:
    scripts declare it themselves, before or after this call, and the engine reads LOCAL_RANK from the
    environment. Calling this twice is harmless.
    """
    if not isinstance(parser, argparse.ArgumentParser):
        raise TypeError(f"add_config_arguments expects an argparse.ArgumentParser, got {type(parser).__name__}")
    group = parser.add_argument_group("dsfast", "dsfast / DeepSpeed configuration")
    if not (_has(parser, "--deepspeed") or _has(parser, "--dsfast")):
        group.add_argument("--deepspeed", "--dsfast", dest="deepspeed", default=False, action="store_true",
                           help="enable dsfast (DeepSpeed-compatible flag; the engine is used either way)")
    if not (_has(parser, "--deepspeed_config") or _has(parser, "--dsfast_config")):
        group.add_argument("--deepspeed_config", "--dsfast_config", dest="deepspeed_config", default=None,
                           type=str, help="path to the ds_config.json")
    return parser
