"""Evaluation of checkpoints and models: ``blocklab-eval`` (``evaluate``: validation loss on the
run's own data or another corpus, and probes), the probe kinds as components (``kinds``:
needle in a haystack, lost in the middle, multi-needle, variable tracking, aggregation, and any
registered with ``register("probe", name)``), the token- and text-space builders they render
with (``items``, ``textspace``), scoring, statistics and reports (``scoring``, ``aggregate``,
``report``, ``plots``), perplexity against length, the backends (blocklab models, Hugging Face
causal LMs: ``backends``, ``hf``) and the probe callback that runs during training."""
