"""deepspeed.utils.RepeatingLoader: iterate a data loader forever, starting it again each time it runs out."""


class RepeatingLoader:
    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:   # one pass done: a new iterator (a sampler with set_epoch() still needs the caller)
            self.data_iter = iter(self.loader)
            return next(self.data_iter)    # an empty loader stops here instead of looping forever
