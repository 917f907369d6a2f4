"""deepspeed.module_inject: DeepSpeed's kernel injection and AutoTP tensor parallelism, which dsfast does not have.
layers.GatherReplacedLayerParams works (no dsfast parameter belongs to a replaced layer); the rest of the package
is not provided."""
