"""The choices that are strings in the config schema (Lightning's names, file formats, ...):
the validators check them; each tuple is the one list of what blocklab supports. Re-exported
by ``blocklab.config.schema``."""

DATA_FORMATS = ("text", "json", "parquet", "disk")  # readers of data.files (disk: save_to_disk)
# the files of a directory in data.files / data.val_files that each format reads
FORMAT_SUFFIXES = {"text": (".txt", ".text", ".md"), "json": (".json", ".jsonl", ".ndjson"),
                   "parquet": (".parquet",)}
DOCUMENT_SPLITS = ("file", "line", "paragraph")  # plain text: what one document is
SOURCE_FINGERPRINTS = ("stat", "content")
LONG_DOCUMENTS = ("split", "truncate")
UTF8_ERRORS = ("replace", "strict")
# Lightning accelerators blocklab runs on ("gpu" = Lightning's alias of the CUDA backend).
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
# Lightning 2.6's precision strings (lightning.fabric.plugins.precision.precision
# _PRECISION_INPUT_STR and its aliases "64", "32", "16", "bf16").
PRECISIONS = ("32-true", "32", "16-mixed", "16", "bf16-mixed", "bf16", "16-true", "bf16-true",
              "64-true", "64", "transformer-engine", "transformer-engine-float16")
# Lightning strategies by name (train/run.py _strategy: "fsdp" and "model_parallel" are
# blocklab's own sharded setups, the rest go to Lightning as is).
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "fsdp", "model_parallel")
WANDB_MODES = ("offline", "online", "disabled")
PROFILERS = ("simple", "advanced", "pytorch")  # Lightning's profilers by name
GRAD_NORMS = ("none", "global", "layer")  # trainer.log_grad_norm
WEIGHT_DECAY_MODES = ("coupled", "independent")  # optim.weight_decay_mode
#: The metrics of a step's logged row a run can watch (early stopping, the best checkpoint),
#: and which way is better for each (train/metrics.py writes them).
ROW_METRICS = ("val/loss", "val/accuracy", "train/loss", "train/grad_norm")
BEST_MODES = {"val/loss": "min", "val/accuracy": "max", "train/loss": "min",
              "train/grad_norm": "min"}
PROBE_SPACES = ("auto", "token", "text")
TEXT_HAYSTACKS = ("essay", "shakespeare")  # built in; anything else is a path to a text file
SEGMENT_MODES = ("none", "split", "stream")  # data.segment_mode (none: rows as they are)
#: data.name=babilong: the bAbI tasks (blocklab.data.babi.TASKS) and the fewest facts a question
#: of each rests on (blocklab.data.babi.MIN_FACTS; qa4 always has 2)
BABILONG_TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")
BABILONG_MIN_FACTS = {"qa1": 1, "qa2": 2, "qa3": 3, "qa4": 2, "qa5": 4}
#: Prompt styles of the BABILong probe: ``plain`` (the training data's format) or the
#: benchmark's own instruction + few-shot examples
BABILONG_PROMPTS = ("plain", "babilong")
