"""The one error type of the launcher: a problem with what the user asked for.

cli.main turns it into `dsfast: error: ...` on stderr and exit code 2 (argparse's convention), so a typo in a
hostfile or an --include spec never starts a single process.
"""


class LaunchError(ValueError):
    """Bad launcher input (hostfile, --include/--exclude, env file, options). The message names the culprit."""


USAGE_EXIT_CODE = 2
