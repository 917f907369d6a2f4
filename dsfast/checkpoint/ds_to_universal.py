"""deepspeed.checkpoint.ds_to_universal: DeepSpeed's converter of a ZeRO checkpoint to its "universal" format, so
that it loads at another world size or parallel layout. dsfast needs no conversion: its checkpoints load at any
world size and ZeRO stage as they are, and a DeepSpeed checkpoint loads into dsfast directly (load_checkpoint) or
converts with `dsfast convert-deepspeed SRC DST`. main() and parse_arguments() import; main refuses, saying that."""
import argparse

from ..unsupported import refuse


def parse_arguments(argv=None):
    """DeepSpeed's command line (--input_folder, --output_folder, ...), for programs that build args with it."""
    parser = argparse.ArgumentParser(description="DeepSpeed ZeRO checkpoint -> universal checkpoint")
    parser.add_argument("--input_folder", type=str, required=True)
    parser.add_argument("--output_folder", type=str, required=True)
    parser.add_argument("--num_extract_workers", type=int, default=4)
    parser.add_argument("--num_merge_workers", type=int, default=2)
    parser.add_argument("--keep_temp_folder", action="store_true")
    parser.add_argument("--strict", dest="strict", action="store_true", default=True)
    parser.add_argument("--no_strict", dest="strict", action="store_false")
    parser.add_argument("--inject_missing_state", action="store_true")
    return parser.parse_args(argv)


def main(args=None):
    source = getattr(args, "input_folder", None)
    refuse(f"ds_to_universal.main(input_folder={source!r})", "conversion to DeepSpeed's universal checkpoint format",
           "dsfast checkpoints load at any world size and ZeRO stage without it; a DeepSpeed checkpoint loads with "
           "engine.load_checkpoint(...) or converts with `dsfast convert-deepspeed SRC DST`")
