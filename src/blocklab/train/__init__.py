"""Training (floor 5): one run from a validated config to a run directory.

``run`` drives it (``train``, ``blocklab-train``; it returns a ``result.RunDir``),
``resume`` continues a run from its stored config and ``init`` starts one from pretrained
weights (``init_from``, through ``convert``). ``module`` is the LightningModule over the shared
objective (``blocklab.objectives``, not here); ``optim`` holds the optimizers and schedules by
name; ``callbacks`` and ``loggers`` the Lightning callbacks and loggers by name; ``metrics``
the durable per-step CSV rows; ``checkpoint_io`` routes Lightning's saves through blocklab's
checkpoint format (``blocklab.checkpoint``) and keeps the newest ones; ``preemption`` turns
SIGTERM into a checkpoint and exit code 7; ``strategies`` the sharded setups (FSDP);
``quiet`` keeps Lightning's chatter out of a run's output. Probes during training come from
``blocklab.eval`` (its callback); ``eval`` never imports this package."""
