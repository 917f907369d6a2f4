"""The one error for a DeepSpeed feature dsfast does not have. Its modules import (programs import them at the
top, or subclass their classes), and using the feature raises this, naming the feature and what to do instead."""


class UnsupportedFeatureError(NotImplementedError):
    """A DeepSpeed feature dsfast does not implement was used."""


def refuse(what, feature, instead="run this program with DeepSpeed itself"):
    """Raise UnsupportedFeatureError: `what` (the call made) needs `feature`, which dsfast lacks."""
    raise UnsupportedFeatureError(f"{what}: {feature} is not supported by dsfast; {instead}")

