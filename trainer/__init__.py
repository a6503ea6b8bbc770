"""foxhunt's DQN trainer. Importing the package imports no torch: `trainer.config` is shared with the service."""
