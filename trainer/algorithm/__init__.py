"""Training algorithms: the built-in actor, losses and advantage estimators (registered
through trainer/api/registry.py; chosen with `train.loss` and `train.advantage`)."""
