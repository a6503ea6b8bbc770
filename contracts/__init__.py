"""What the controller and the trainer agree on, torch-free: the config model, the plan registry, the job
pipeline as a graph, and the job files. A leaf: it imports neither `trainer` nor `service`, both import it."""
