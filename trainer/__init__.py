"""foxhunt's DQN trainer. Importing the package imports no torch: `contracts.config` is shared with the service."""
