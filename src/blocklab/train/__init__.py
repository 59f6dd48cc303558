"""Training: objectives, optimizer groups and schedules, the LightningModule, the run driver."""
